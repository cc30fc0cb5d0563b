"""What the engine core hands back after a step: token-level results, one per engine request.

The core knows tokens, never text: detokenization, stop strings and n > 1 grouping happen in
the `OutputProcessor`, in the same thread (offline engine) or in the service process (engine
core in a child process). These cross the process boundary as typed MessagePack, so they are
plain msgspec structs.
"""

import msgspec

from shared.engine_api.outputs import FinishReason, SampledLogprobs
from shared.kv_transfer.types import KVTransferResult


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    # The engine request: the request id, or "<id>#<index>" for completion index of n > 1.
    request_id: str
    new_token_ids: list[int] = []
    # One entry per new token when the request asked for logprobs.
    new_logprobs: list[SampledLogprobs] | None = None
    # Prompt positions scored this step (first completion only).
    new_prompt_logprobs: list[SampledLogprobs] = []
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None  # the stop token id that ended it
    num_cached_tokens: int = 0
    # With finish_reason "error": what went wrong computing this request.
    error: str | None = None
    # time.monotonic() of the first step that scheduled it (a clock all processes share).
    first_scheduled_time: float | None = None
    # Final output of a request whose prompt KV was sent: what moved, or why it did not.
    kv_transfer: KVTransferResult | None = None
    kv_transfer_error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def child_request_id(request_id: str, index: int, n: int) -> str:
    """The engine request id of completion `index` of a request with n completions."""
    return request_id if n == 1 else f"{request_id}#{index}"
