"""StepProbe: the EngineProbe (shared.engine_api.probe) of an LLMEngine, stepped on the
caller's thread. The KV transport's timing is handed in by whoever builds it (the composition
root), as the engine imports no transport."""

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from shared.engine.introspection import engine_info, engine_load
from shared.engine.llm_engine import LLMEngine
from shared.engine_api.client import EngineInfo, EngineLoad
from shared.engine_api.probe import PromptSource
from shared.kv_cache.layout import KVCacheLayout
from shared.kv_tier.load_timing import time_arena_loads
from shared.sampling.params import SamplingParams

# (kv_cache, layout, prompt_lengths, repeats) -> per length, `repeats` timings in seconds.
KVSendTimer = Callable[[torch.Tensor, KVCacheLayout, Sequence[int], int], list[list[float]]]

FIRST_TOKEN_ONLY = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
NEIGHBOUR_DECODE_TOKENS = 256


class StepProbe:
    def __init__(self, engine: LLMEngine, time_kv_sends: KVSendTimer | None = None):
        self.engine = engine
        self.info: EngineInfo = engine_info(engine.core)
        self._time_kv_sends = time_kv_sends

    def load(self) -> EngineLoad:
        return engine_load(self.engine.core)

    def _kv_cache(self) -> tuple[torch.Tensor, KVCacheLayout]:
        executor = self.engine.core.executor
        return executor.kv_cache, executor.kv_cache_layout

    def _run_to_completion(self) -> None:
        while self.engine.has_unfinished_requests():
            self.engine.step()

    def time_lone_prompt(self, prompt_token_ids: list[int]) -> float:
        started = time.perf_counter()
        self.engine.add_request(prompt_token_ids, FIRST_TOKEN_ONLY)
        self._run_to_completion()
        return time.perf_counter() - started

    def time_decode_steps(self, prompts: Sequence[list[int]], num_steps: int) -> list[float]:
        params = SamplingParams(temperature=0.0, max_tokens=num_steps + 2, ignore_eos=True)
        request_ids = [self.engine.add_request(prompt, params) for prompt in prompts]
        while any(not request.output_token_ids for rid in request_ids for request in self.engine.requests_of(rid)):
            self.engine.step()
        timings = []
        for _ in range(num_steps):
            started = time.perf_counter()
            self.engine.step()
            timings.append(time.perf_counter() - started)
        for request_id in request_ids:
            self.engine.abort_request(request_id)
        return timings

    def time_kv_sends(self, prompt_lengths: Sequence[int], repeats: int) -> list[list[float]]:
        if self._time_kv_sends is None:
            raise RuntimeError("this probe was built without a KV transport to time")
        return self._time_kv_sends(*self._kv_cache(), prompt_lengths, repeats)

    def time_tier_loads(self, directory: str, run_lengths: Sequence[int],
                        repeats: int) -> list[tuple[int, list[float]]]:
        return time_arena_loads(Path(directory), *self._kv_cache(), run_lengths, repeats)

    def keep_prefilling(self, prompt: PromptSource, stop: threading.Event, on_ready: Callable[[], None]) -> None:
        ready = False
        while not stop.is_set():
            self.engine.add_request(prompt(), FIRST_TOKEN_ONLY)
            self._run_to_completion()
            if not ready:
                on_ready()
                ready = True

    def keep_decoding(self, prompt: PromptSource, batch_size: int, stop: threading.Event,
                      on_ready: Callable[[], None]) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=NEIGHBOUR_DECODE_TOKENS, ignore_eos=True)
        in_flight, producing = set(), set()
        ready = False
        while not stop.is_set():
            while len(in_flight) < batch_size:
                in_flight.add(self.engine.add_request(prompt(), params))
            for output in self.engine.step():
                producing.add(output.request_id)
                if output.finished:
                    in_flight.discard(output.request_id)
                    producing.discard(output.request_id)
            if not ready and in_flight <= producing:
                on_ready()
                ready = True
        for request_id in in_flight:
            self.engine.abort_request(request_id)

    def shutdown(self) -> None:
        self.engine.shutdown()
