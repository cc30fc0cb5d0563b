"""A request as the scheduler sees it: tokens, progress, status."""

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.kv_cache.block_hash import BlockHash
from shared.sampling.params import SamplingParams

if TYPE_CHECKING:
    from xgrammar import GrammarMatcher


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    # Decode role: blocks reserved, the prompt's KV is on its way from a prefill instance.
    RESERVED = "reserved"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    # Computing this request failed (its `error` says how); the engine carries on without it.
    FINISHED_ERROR = "error"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED,
                        RequestStatus.FINISHED_ERROR)

    @property
    def finish_reason(self) -> str | None:
        return self.value if self.is_finished else None


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    # Tokens that end generation unless params.ignore_eos (the model's EOS ids).
    eos_token_ids: tuple[int, ...] = ()
    # Most tokens this request may generate (max_tokens clipped to the model and cache).
    max_output_tokens: int = 16
    # Extra prefix-cache keys (e.g. a tenant salt).
    cache_salt: str | None = None
    # Prefill role: keep the blocks after finishing until the KV has been shipped.
    hold_blocks_on_finish: bool = False
    # For n > 1: the sibling whose computed prompt blocks this one shares.
    prompt_parent: "Request | None" = None
    arrival_time: float = field(default_factory=time.monotonic)
    # time.monotonic() of the first engine step that scheduled it (set by EngineStats).
    first_scheduled_time: float | None = None

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens whose KV is in the cache; catches up with num_tokens step by step.
    num_computed_tokens: int = 0
    # Prompt tokens served from the prefix cache when first scheduled.
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    block_hashes: list[BlockHash] = field(default_factory=list)
    stop_reason: int | str | None = None
    # Why the request finished with FINISHED_ERROR (bounded, safe to show the client).
    error: str | None = None
    # Guided decoding: the request's own place in its grammar (shared.guided.engine_support);
    # kept across preemption, since the request's tokens do not change.
    guided_matcher: "GrammarMatcher | None" = None
    # Speculative decoding with a draft model: positions whose draft KV is computed (reset to
    # 0 by preemption, like num_computed_tokens).
    num_draft_computed_tokens: int = 0

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_to_compute(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
