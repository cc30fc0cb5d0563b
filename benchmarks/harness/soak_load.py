"""The soak benchmark's traffic: an operator's steady mix of OpenAI streaming requests.

Kinds (weights in `SoakMix`): plain prompts, long prompts, n=2 with logprobs=5, requests the
client cancels after a few tokens, and guided_json with a schema no earlier request used. Each
request goes to `/v1/completions` with token-id prompts and is timed like the bench clients
(first token, every later chunk). Arrivals are Poisson at `rate` requests a second.
"""

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx2

from services.bench.records import RequestRecord

KINDS = ("plain", "long", "n2_logprobs", "cancelled", "guided")
CANCEL_AFTER_CHUNKS = 4


@dataclass(frozen=True)
class SoakMix:
    """Relative weights of the kinds and the prompt/output lengths drawn for each request."""

    weights: dict[str, float] = field(default_factory=lambda: {
        "plain": 0.6, "long": 0.15, "n2_logprobs": 0.1, "cancelled": 0.07, "guided": 0.08})
    short_prompt: tuple[int, int] = (50, 600)
    long_prompt: tuple[int, int] = (1000, 1499)
    output_len: tuple[int, int] = (16, 256)


@dataclass
class SoakRecord(RequestRecord):
    kind: str = "plain"


def guided_schema(index: int) -> dict:
    """A small JSON schema unique to request `index` (so every guided request compiles anew)."""
    return {"type": "object", "properties": {f"answer_{index}": {"type": "string", "maxLength": 12},
                                             "score": {"type": "integer"}},
            "required": [f"answer_{index}", "score"]}


def request_body(kind: str, index: int, mix: SoakMix, model: str, rng: random.Random,
                 token_ids: list[int]) -> dict:
    """The /v1/completions body of request `index` of `kind`."""
    low, high = mix.long_prompt if kind == "long" else mix.short_prompt
    prompt = rng.choices(token_ids, k=rng.randint(low, high))
    body = {"model": model, "prompt": prompt, "max_tokens": rng.randint(*mix.output_len), "stream": True,
            "temperature": 0.7, "seed": index, "ignore_eos": True, "stream_options": {"include_usage": True}}
    if kind == "n2_logprobs":
        body.update(n=2, logprobs=5)
    if kind == "guided":
        body.update(guided_json=guided_schema(index), ignore_eos=False, max_tokens=64)
    return body


class SoakLoad:
    """Sends the mix until `stop_s`; `records` collects every request (errors included)."""

    def __init__(self, base_url: str, model: str, token_ids: list[int], mix: SoakMix, rate: float, seed: int = 0):
        self.url = f"{base_url.rstrip('/')}/v1/completions"
        self.model, self.token_ids, self.mix, self.rate = model, token_ids, mix, rate
        self.rng = random.Random(seed)
        self.records: list[SoakRecord] = []
        self.started = time.perf_counter()

    async def run(self, duration_s: float) -> None:
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx2.AsyncClient(timeout=600.0, limits=limits) as http:
            tasks, index = [], 0
            while (now := time.perf_counter() - self.started) < duration_s:
                kind = self.rng.choices(list(self.mix.weights), list(self.mix.weights.values()))[0]
                body = request_body(kind, index, self.mix, self.model, self.rng, self.token_ids)
                record = SoakRecord(index, len(body["prompt"]), body["max_tokens"], start_s=now, kind=kind)
                self.records.append(record)
                tasks.append(asyncio.ensure_future(self._send(http, body, record)))
                index += 1
                await asyncio.sleep(self.rng.expovariate(self.rate))
            await asyncio.gather(*tasks)

    async def _send(self, http, body: dict, record: SoakRecord) -> None:
        started = time.perf_counter()
        try:
            async with http.stream("POST", self.url, json=body) as response:
                if response.status_code != 200:
                    record.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                else:
                    await self._read(response, record, started)
        except Exception as error:  # noqa: BLE001 - one failed request must not stop the soak
            record.error = f"{type(error).__name__}: {error}"
        record.end_s = time.perf_counter() - started

    async def _read(self, response, record: SoakRecord, started: float) -> None:
        async for line in response.aiter_lines():
            data = line.removeprefix("data:").strip()
            if not line.startswith("data:") or data == "[DONE]":
                continue
            event = json.loads(data)
            if "error" in event:
                record.error = f"stream error: {event['error']}"
                return
            if any(c.get("text") and c.get("index", 0) == 0 for c in event.get("choices") or []):  # n=2: one stream
                record.add_chunk(time.perf_counter() - started, 1)
            if record.kind == "cancelled" and len(record.chunk_times_s) >= CANCEL_AFTER_CHUNKS:
                return  # leaving the stream closes the connection: the gateway cancels the request
