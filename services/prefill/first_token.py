"""The first token of a prompt as the client gets it, and whether the completion ends with it.

The prefill's engine request samples one token without the user's stop strings (the decode
side applies those while it decodes). The client's text for that token must be exactly what
the decode side's output processor makes of it, so that the gateway can send it at once and
drop it from the Decode stream: the decoded delta goes through a `StopStringMatcher` with the
request's stop strings, as the decode side's own matcher, fresh at the same point, will take
it. When the prefill's request finishes, the rest of the text (what the matcher held back,
and the detokenizer's flush) follows as the decode side would flush it, should the completion
end with this token.

A completion ends with its first token, as the decode side will find, when the engine stopped
it for a reason of its own (EOS, a stop token id, the constraint completed), when max_tokens or
the model's length allow no more, or when a stop string matched (checked in that order, as the
output processor does: an engine finish keeps the engine's reason).
"""

from dataclasses import dataclass

from shared.engine_api.outputs import FinishReason, RequestOutput
from shared.pb.pdserve.v1 import generation_pb2, instance_pb2 as pb
from shared.sampling.params import SamplingParams
from shared.tokenization.stop_strings import StopStringMatcher
from shared.wire.outputs import logprobs_to_proto


@dataclass(frozen=True)
class Ending:
    """How a completion that ends with its first token ends."""

    finish_reason: int  # generation_pb2.FinishReason
    stop_reason: int | str | None
    final_text: str  # after FirstToken.text


class FirstTokenText:
    """The user's stop strings over the first token's text, as the decode side applies them."""

    def __init__(self, params: SamplingParams):
        self.matcher = StopStringMatcher(list(params.stop), params.include_stop_str_in_output)

    def first(self, delta_text: str) -> str:
        """The text the client gets with the token (the detokenizer's delta for it)."""
        return self.matcher.push(delta_text)[0]

    def rest(self, final_delta_text: str) -> str:
        """The text that follows it if the completion ends there (the final output's delta)."""
        text, is_stopped = self.matcher.push(final_delta_text)
        return text if is_stopped else text + self.matcher.flush()


def first_token_message(output: RequestOutput, text: str) -> pb.FirstToken:
    completion = output.outputs[0]
    message = pb.FirstToken(token_id=completion.token_ids[-1], text=text)
    if completion.logprobs:
        message.logprobs.CopyFrom(logprobs_to_proto(message.token_id, completion.logprobs[-1]))
    if output.prompt_logprobs:
        prompt = output.prompt_token_ids
        message.prompt_logprobs.extend(logprobs_to_proto(prompt[i + 1], entry)
                                       for i, entry in enumerate(output.prompt_logprobs))
    return message


def ending(final: RequestOutput, params: SamplingParams, num_resumed: int, max_model_len: int,
           text: FirstTokenText) -> Ending | None:
    """How the completion ends with its first token, or None when it goes on (`final`: the
    prefill's final output; the engine's "length" is only real when the user's max_tokens or
    the model's length says so, the prefill request itself stops after one token)."""
    completion = final.outputs[0]
    num_tokens = len(final.prompt_token_ids) + num_resumed + 1
    if completion.finish_reason == FinishReason.STOP:
        return Ending(generation_pb2.FINISH_REASON_STOP, completion.stop_reason, text.rest(completion.delta_text))
    if (params.max_tokens is not None and params.max_tokens <= num_resumed + 1) or num_tokens >= max_model_len:
        return Ending(generation_pb2.FINISH_REASON_LENGTH, None, text.rest(completion.delta_text))
    if text.matcher.is_stopped:  # by the token's own text (no flush: the decode side would not flush)
        return Ending(generation_pb2.FINISH_REASON_STOP, text.matcher.matched_stop, "")
    return None


def add_ending(response: pb.PrefillResponse, end: Ending) -> None:
    response.finish_reason = end.finish_reason
    response.final_text = end.final_text
    if isinstance(end.stop_reason, str):
        response.stop_string = end.stop_reason
    elif isinstance(end.stop_reason, int):
        response.stop_token_id = end.stop_reason
