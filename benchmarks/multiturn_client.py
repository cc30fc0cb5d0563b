"""One chat turn over OpenAI's streaming `/v1/chat/completions` (any server that speaks it):
greedy, exactly `max_tokens` tokens (EOS ignored), with the usage chunk (prompt tokens and
the cached ones when the server reports them)."""

import time
from dataclasses import dataclass

import httpx2

from services.bench.clients.openai_client import sse_events



@dataclass
class TurnResult:
    chat: int
    turn: int
    start_s: float           # since the benchmark started
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    answer: str = ""
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # None: the server did not say
    error: str | None = None

    @property
    def is_ok(self) -> bool:
        return self.error is None and self.ttft_s > 0


async def send_turn(http: httpx2.AsyncClient, base_url: str, model: str, messages: list[dict], max_tokens: int,
                    result: TurnResult) -> None:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    try:
        async with http.stream("POST", f"{base_url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:300]}"
            else:
                await _read_stream(response, result, started)
    except Exception as error:  # a broken connection is recorded, the benchmark goes on
        result.error = f"{type(error).__name__}: {error}"
    result.e2e_s = time.perf_counter() - started


async def _read_stream(response, result: TurnResult, started: float) -> None:
    async for event in sse_events(response):
        if "error" in event:
            result.error = f"stream error: {event['error']}"
            return
        for choice in event.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") or ""
            if text and not result.ttft_s:
                result.ttft_s = time.perf_counter() - started
            result.answer += text
        usage = event.get("usage")
        if usage:
            result.prompt_tokens = usage.get("prompt_tokens", 0)
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                result.cached_tokens = details["cached_tokens"]
