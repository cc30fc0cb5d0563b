"""A prompt-only request (an OpenAI echo with max_tokens 0: lm-eval's loglikelihood requests)
on the disaggregated route: one Prefill with no destination, so no decode reservation and no
KV transfer; the prefill instance scores the prompt and its generated token is dropped. The
one message carries the prompt logprobs (when asked for), finish reason LENGTH, and the usage
with 0 completion tokens."""

from collections.abc import AsyncIterator

from shared.pb.pdserve.v1 import generation_pb2

from services.gateway.deadline import Deadline
from services.gateway.prefill_calls import prefill_outcome
from services.gateway.relay_context import RelayContext
from services.gateway.request_prep import SubRequest
from services.gateway.router import Candidate


async def run_prompt_only(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                          deadline: Deadline) -> AsyncIterator[generation_pb2.GenerateResponse]:
    reply = await prefill_outcome(ctx, sub, candidates, None, deadline)
    message = generation_pb2.GenerateResponse(
        request_id=sub.request_id, finish_reason=generation_pb2.FINISH_REASON_LENGTH,
        usage=generation_pb2.Usage(prompt_tokens=len(sub.parent.prompt_token_ids), completion_tokens=0,
                                   cached_prompt_tokens=reply.num_cached_prompt_tokens))
    if sub.params.prompt_logprobs is not None:
        message.prompt_logprobs.extend(reply.prompt_logprobs)
    yield message
