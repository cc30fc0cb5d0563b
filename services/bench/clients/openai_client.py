"""`--backend openai` (/v1/completions) and `openai-chat` (/v1/chat/completions) over SSE.

Uses httpx2 (the HTTP client the openai package depends on). Completions send the prompt as
token ids (vLLM and pdserve accept them); chat sends the prompt's text as one user message.
Every SSE chunk with non-empty text counts as one token; the usage chunk (requested with
`stream_options.include_usage`) gives the real completion token count.
"""

import json
import time
from collections.abc import AsyncIterator

import httpx2

from services.bench.clients.base import ClientOptions
from services.bench.datasets import BenchPrompt
from services.bench.records import RequestRecord

SSE_DATA_PREFIX = "data:"
SSE_DONE = "[DONE]"


async def sse_events(response) -> AsyncIterator[dict]:
    """The JSON events of an OpenAI server-sent-event stream, up to its `[DONE]`."""
    async for line in response.aiter_lines():
        if not line.startswith(SSE_DATA_PREFIX):
            continue
        data = line[len(SSE_DATA_PREFIX):].strip()
        if data == SSE_DONE:
            return
        yield json.loads(data)


def api_base(target: str) -> str:
    """`http://host:port` or `.../v1` -> `.../v1` without a trailing slash."""
    base = target.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


class OpenAIStreamClient:
    def __init__(self, options: ClientOptions, is_chat: bool):
        self.options = options
        self.is_chat = is_chat
        self.base = api_base(options.target)
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
        self.http = httpx2.AsyncClient(timeout=options.timeout_s, limits=limits)

    def build_body(self, prompt: BenchPrompt) -> dict:
        body = {"model": self.options.model, "max_tokens": prompt.output_len, "stream": True,
                "temperature": self.options.temperature, "ignore_eos": self.options.ignore_eos,
                "stream_options": {"include_usage": True}}
        if self.is_chat:
            body["messages"] = [{"role": "user", "content": prompt.prompt_text or ""}]
        else:
            body["prompt"] = prompt.prompt_token_ids
        return body

    async def send(self, prompt: BenchPrompt, record: RequestRecord) -> None:
        url = f"{self.base}/chat/completions" if self.is_chat else f"{self.base}/completions"
        started = time.perf_counter()
        try:
            async with self.http.stream("POST", url, json=self.build_body(prompt)) as response:
                if response.status_code != 200:
                    body = (await response.aread()).decode(errors="replace")
                    record.error = f"HTTP {response.status_code}: {body[:300]}"
                else:
                    await self._read_events(response, record, started)
        except Exception as error:  # a broken connection must not stop the benchmark
            record.error = f"{type(error).__name__}: {error}"
        record.end_s = time.perf_counter() - started

    async def _read_events(self, response, record: RequestRecord, started: float) -> None:
        async for event in sse_events(response):
            if "error" in event:
                record.error = f"stream error: {event['error']}"
                return
            if self._chunk_text(event):
                record.add_chunk(time.perf_counter() - started, 1)
            if event.get("usage"):
                record.reported_output_len = event["usage"].get("completion_tokens")

    def _chunk_text(self, event: dict) -> str:
        choices = event.get("choices") or []
        if not choices:
            return ""
        if self.is_chat:
            return (choices[0].get("delta") or {}).get("content") or ""
        return choices[0].get("text") or ""

    async def close(self) -> None:
        await self.http.aclose()


async def first_model_id(target: str, timeout_s: float = 10.0) -> str:
    """The first model `GET /v1/models` lists (used when --model is not given)."""
    async with httpx2.AsyncClient(timeout=timeout_s) as http:
        response = await http.get(f"{api_base(target)}/models")
        response.raise_for_status()
        return response.json()["data"][0]["id"]
