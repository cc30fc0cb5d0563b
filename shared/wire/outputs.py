"""Engine outputs -> GenerateResponse messages, and logprobs both ways."""

from shared.engine_api.outputs import CompletionOutput, FinishReason, RequestOutput, SampledLogprobs
from shared.pb.pdserve.v1 import generation_pb2 as pb

FINISH_REASONS = {
    None: pb.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORT: pb.FINISH_REASON_ABORT,
}
FINISH_REASONS_FROM_PROTO = {value: key for key, value in FINISH_REASONS.items()}


def finish_reason_from_proto(reason: int) -> FinishReason | None:
    """The wire's enum back to the engine's (None: not finished); an unknown value is STOP."""
    return FINISH_REASONS_FROM_PROTO.get(reason, FinishReason.STOP)


def logprobs_to_proto(token_id: int, entry: SampledLogprobs) -> pb.PositionLogprobs:
    return pb.PositionLogprobs(token_id=token_id, logprob=entry.logprob,
                               top=[pb.TokenLogprob(token_id=t, logprob=lp) for t, lp in entry.top])


def logprobs_from_proto(message: pb.PositionLogprobs) -> SampledLogprobs:
    return SampledLogprobs(message.logprob, [(entry.token_id, entry.logprob) for entry in message.top])


def completion_to_proto(request_id: str, completion: CompletionOutput) -> pb.GenerateResponse:
    """The delta of one completion since its previous message."""
    message = pb.GenerateResponse(request_id=request_id, index=completion.index, text=completion.delta_text,
                                  token_ids=completion.delta_token_ids,
                                  finish_reason=FINISH_REASONS[completion.finish_reason])
    if completion.logprobs is not None:
        new = completion.logprobs[len(completion.logprobs) - len(completion.delta_token_ids):]
        message.logprobs.extend(logprobs_to_proto(t, e) for t, e in zip(completion.delta_token_ids, new))
    if isinstance(completion.stop_reason, str):
        message.stop_string = completion.stop_reason
    elif isinstance(completion.stop_reason, int):
        message.stop_token_id = completion.stop_reason
    return message


def request_output_to_protos(output: RequestOutput, with_prompt_logprobs: bool) -> list[pb.GenerateResponse]:
    """One message per completion that changed (and every finished one's final message)."""
    messages = [completion_to_proto(output.request_id, c) for c in output.outputs
                if c.delta_token_ids or c.delta_text or c.finished]
    if messages and with_prompt_logprobs and output.prompt_logprobs:
        prompt = output.prompt_token_ids
        messages[0].prompt_logprobs.extend(
            logprobs_to_proto(prompt[i + 1], e) for i, e in enumerate(output.prompt_logprobs))
    if messages and output.finished:
        messages[-1].usage.CopyFrom(pb.Usage(
            prompt_tokens=len(output.prompt_token_ids),
            completion_tokens=sum(len(c.token_ids) for c in output.outputs),
            cached_prompt_tokens=output.num_cached_tokens))
    return messages
