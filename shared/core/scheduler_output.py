"""What one engine step computes: the scheduler's decision handed to the executor.

Plain data, so a multi-process executor can ship it to workers unchanged in meaning.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.lora.request import LoRARequest
from shared.sampling.params import SamplingParams

if TYPE_CHECKING:
    import torch


@dataclass
class ScheduledRequest:
    request_id: str
    # Tokens whose KV this step computes: positions start_position .. +len(token_ids)-1.
    token_ids: list[int]
    start_position: int
    # The request's whole block table after this step's allocation.
    block_ids: list[int]
    # Set when this chunk reaches the request's last known token: a token is sampled.
    sampling_params: SamplingParams | None
    # References to the request's tokens (penalties, min_tokens, prompt logprobs targets).
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    # Ids suppressed while the output is shorter than min_tokens.
    stop_and_eos_token_ids: tuple[int, ...] = ()
    # The token following each scheduled position, when prompt logprobs are wanted.
    prompt_logprob_targets: list[int] | None = None
    # Top alternatives wanted per prompt position (with prompt_logprob_targets).
    num_prompt_logprobs: int = 0
    # Guided decoding, set by the engine before the step on constrained sampling rows: the
    # allowed tokens, one bit each (int32 words, shared.guided.bitmask's layout).
    guided_bitmask: "torch.Tensor | None" = None
    # Speculative decoding (shared.spec_decode): the most tokens the proposer may add after
    # token_ids (the scheduler allocated their slots); 0: no speculation for this row.
    num_spec_tokens: int = 0
    # Draft model: positions whose draft KV is computed (its catch-up starts there).
    num_draft_computed_tokens: int = 0
    # Set by the model runner: the proposed tokens, appended to token_ids for verification.
    draft_token_ids: list[int] = field(default_factory=list)
    # The LoRA adapter its rows run with (None: the base model).
    lora_request: LoRARequest | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def is_decode(self) -> bool:
        return len(self.token_ids) == 1


@dataclass
class SchedulerOutput:
    # Single-token rows first (decodes), then prompt chunks.
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    # Requests that ended since the last step; workers drop their per-request state.
    finished_request_ids: set[str] = field(default_factory=set)
    preempted_request_ids: list[str] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(item.num_tokens for item in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
