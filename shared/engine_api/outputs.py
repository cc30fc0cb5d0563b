"""What the engine hands back per request: cumulative results plus this step's delta."""

from dataclasses import dataclass, field

from shared.kv_transfer.types import KVTransferResult
from shared.sampling.finish_reason import FinishReason

__all__ = ["CompletionOutput", "FinishReason", "RequestOutput", "SampledLogprobs", "TopLogprobs"]

TopLogprobs = list[tuple[int, float]]


@dataclass
class SampledLogprobs:
    """A sampled (or scored) token's logprob and the top alternatives, (token id, logprob)."""
    logprob: float
    top: TopLogprobs


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    # One entry per generated token when logprobs were asked for.
    logprobs: list[SampledLogprobs] | None = None
    finish_reason: FinishReason | None = None
    # The stop string or stop token id that ended generation, if any.
    stop_reason: int | str | None = None
    # What is new since this request's previous output (for streaming).
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    # With finish_reason "error": what went wrong computing this completion.
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    # Entry i scores prompt token i+1 given the tokens before it, when asked for.
    prompt_logprobs: list[SampledLogprobs] | None = None
    # Prompt tokens served from the prefix cache (first completion).
    num_cached_tokens: int = 0
    # time.monotonic() (a clock every process of the machine shares) of the request's arrival,
    # and of the first step that scheduled it (None until then, and on the decode role).
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    # Final output of a request whose prompt KV was sent: what moved, or why it did not.
    kv_transfer: KVTransferResult | None = None
    kv_transfer_error: str | None = None

    @property
    def finished(self) -> bool:
        return all(output.finished for output in self.outputs)

    @property
    def error(self) -> str | None:
        """The first failed completion's error, if any completion failed."""
        return next((output.error for output in self.outputs if output.error is not None), None)

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids
