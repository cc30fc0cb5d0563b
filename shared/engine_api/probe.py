"""EngineProbe: what `pdserve profile` times on an engine that runs nothing else (issue 29).

The profiler (services/planner/profiler.py) measures an instance's costs through this protocol
and never touches the engine's scheduler, executor or KV cache; the composition root
(services/instance/engine_setup.py, `build_engine_probe`) builds the engine and its probe. Every
method runs the engine on the caller's thread and leaves it as it found it: no request left,
every KV block free.
"""

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from shared.engine_api.client import EngineInfo, EngineLoad

PromptSource = Callable[[], list[int]]


class EngineProbe(Protocol):
    info: EngineInfo

    def load(self) -> EngineLoad:
        """Requests and free blocks now (a probe between calls holds none)."""

    def time_lone_prompt(self, prompt_token_ids: list[int]) -> float:
        """Seconds to compute `prompt_token_ids` and sample the first token, alone in the engine
        (EOS ignored; a prefix the engine has cached is a hit)."""

    def time_decode_steps(self, prompts: Sequence[list[int]], num_steps: int) -> list[float]:
        """Start every prompt, step until each has its first token, then time `num_steps` steps
        of the batch decoding (seconds each); the requests are aborted after."""

    def time_kv_sends(self, prompt_lengths: Sequence[int], repeats: int) -> list[list[float]]:
        """Per prompt length, `repeats` timings (seconds) of sending that many tokens' blocks of
        this engine's KV cache over the KV transport on loopback to a receiver in this process,
        each until the receiver acknowledges. A first send warms the connection up, untimed."""

    def time_tier_loads(self, directory: str, run_lengths: Sequence[int],
                        repeats: int) -> list[tuple[int, list[float]]]:
        """Store blocks of this engine's KV cache in a KV tier arena in `directory` (which the
        caller owns and removes), then time loading runs of them back into pool blocks, CRC-32
        checked: per run length that fits the cache, `repeats` timings (seconds)."""

    def keep_prefilling(self, prompt: PromptSource, stop: threading.Event, on_ready: Callable[[], None]) -> None:
        """Prefill `prompt()`s back to back until `stop` is set (a busy neighbour); `on_ready`
        runs once, after the first."""

    def keep_decoding(self, prompt: PromptSource, batch_size: int, stop: threading.Event,
                      on_ready: Callable[[], None]) -> None:
        """Keep `batch_size` sequences decoding until `stop` is set (a finished one replaced by a
        new `prompt()`); `on_ready` runs once every sequence has produced a token."""

    def shutdown(self) -> None: ...
