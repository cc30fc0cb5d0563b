"""The executor interface: the scheduler's only way to reach the model.

An in-process executor runs the model runner directly; a multi-process executor (tensor or
pipeline parallel workers) implements the same three calls.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from shared.core.scheduler_output import SchedulerOutput
from shared.kv_cache.layout import KVCacheLayout
from shared.spec_decode.outputs import VerifiedTokens

TopLogprobs = list[tuple[int, float]]


@dataclass
class SampledLogprobs:
    logprob: float
    top: TopLogprobs


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
