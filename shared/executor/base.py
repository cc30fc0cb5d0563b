"""The executor interface: the scheduler's only way to reach the model.

An in-process executor runs the model runner directly; a multi-process executor (tensor or
pipeline parallel workers) implements the same three calls.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.core.scheduler_output import SchedulerOutput
from shared.core.verified_tokens import VerifiedTokens
from shared.engine_api.outputs import SampledLogprobs
from shared.kv_cache.layout import KVCacheLayout

if TYPE_CHECKING:
    import torch

    from shared.model.compute_paths import ComputePaths


@dataclass
class ModelRunnerOutput:
    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    # Only for requests that asked for logprobs.
    logprobs: dict[str, SampledLogprobs] = field(default_factory=dict)
    # Per request, one entry per prompt position scored this step.
    prompt_logprobs: dict[str, list[SampledLogprobs]] = field(default_factory=dict)
    # Speculating requests whose proposals were verified: their tokens this step (instead of
    # an entry in sampled_token_ids).
    verified: dict[str, VerifiedTokens] = field(default_factory=dict)
    # Requests whose own computation failed this step (request id -> message); the engine
    # finishes them with an error, every other request carries on.
    failed: dict[str, str] = field(default_factory=dict)


class Executor(ABC):
    # Which kernels the model runs (shared/model/compute_paths.py), set by whoever built it.
    compute_paths: "ComputePaths | None" = None

    @property
    @abstractmethod
    def kv_cache_layout(self) -> KVCacheLayout:
        """The layout of the paged KV cache the workers allocated."""

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step: write the scheduled tokens' KV, sample where asked."""

    @abstractmethod
    def shutdown(self) -> None:
        """Release workers and memory."""

    def resident_lora_ids(self) -> list[int]:
        """The lora_int_ids of the LoRA adapters the model runner holds in memory now (read from
        disk on first use, least recently used dropped): a request for one skips that read."""
        return []

    # ---- several batches in flight (pipeline parallelism) ---------------------------------

    @property
    def max_concurrent_batches(self) -> int:
        """How many batches the engine may submit before collecting the oldest; above 1 the
        engine uses submit_batch/collect_batch instead of execute_model."""
        return 1

    def submit_batch(self, scheduler_output: SchedulerOutput) -> None:
        raise NotImplementedError(f"{type(self).__name__} runs one batch at a time")

    def collect_batch(self) -> ModelRunnerOutput:
        """The result of the oldest submitted batch (batches complete in submission order)."""
        raise NotImplementedError(f"{type(self).__name__} runs one batch at a time")

    # ---- KV transfer (disaggregation); executors expose a full-layout `kv_cache` tensor ----

    def blocks_for_send(self, block_ids: list[int]) -> "tuple[torch.Tensor, KVCacheLayout, list[int]]":
        """(cache tensor, its layout, the blocks' ids in it) for a KV sender to read `block_ids`."""
        return self.kv_cache, self.kv_cache_layout, list(block_ids)

    def commit_received_blocks(self, block_ids: list[int]) -> None:
        """A KV receiver finished writing these blocks into `kv_cache` (a sharded executor copies
        them to its ranks here)."""
