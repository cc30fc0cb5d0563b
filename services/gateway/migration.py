"""Mid-stream migration: a completion whose decode instance is lost after the client got some
of its tokens continues on another decode instance.

The continuation sends the prompt followed by every token already streamed, marked as
resumed outputs (`num_resumed_output_tokens` on Reserve and Prefill): a prefill instance
computes them like a prompt (its prefix cache first) and samples the next token, and the new
decode instance goes on from there. The engine counts resumed tokens as outputs (max_tokens,
min_tokens, penalties, the grammar's state, the seeded generator's position), so the client
sees one uninterrupted stream; usage counts are fixed up here.
"""

import dataclasses

from shared.pb.pdserve.v1 import generation_pb2

from services.gateway.request_prep import SubRequest


def continuation(sub: SubRequest, streamed_token_ids: list[int]) -> SubRequest:
    """The sub-request that continues after `streamed_token_ids` (prompt logprobs were sent)."""
    params = dataclasses.replace(sub.params, prompt_logprobs=None)
    return dataclasses.replace(sub, params=params, resumed_token_ids=tuple(streamed_token_ids))


def retry_of(attempt: SubRequest, base_id: str, num_lost: int) -> SubRequest:
    """The attempt after `num_lost` lost ones, under an id of its own (`<base_id>@<n>`): an instance that hung holds the lost attempt's work under the old id until it
    resumes (a prefill still sending its KV, a reservation), and the new attempt may land on
    that same prefill instance."""
    return dataclasses.replace(attempt, request_id=f"{base_id}@{num_lost}")


def is_complete(sub: SubRequest, streamed_token_ids: list[int]) -> bool:
    """Every token max_tokens allows was streamed (only the final message was lost)."""
    return sub.params.max_tokens is not None and len(streamed_token_ids) >= sub.params.max_tokens


def final_message(sub: SubRequest, streamed_token_ids: list[int]) -> generation_pb2.GenerateResponse:
    """The last message of a completion whose decode instance died right after its last token."""
    message = generation_pb2.GenerateResponse(finish_reason=generation_pb2.FINISH_REASON_LENGTH)
    message.usage.prompt_tokens = len(sub.parent.prompt_token_ids)
    message.usage.completion_tokens = len(streamed_token_ids)
    return message


def fix_usage(sub: SubRequest, message: generation_pb2.GenerateResponse) -> None:
    """A continuation's instance counts only what it generated: add what came before."""
    if sub.resumed_token_ids and message.HasField("usage"):
        message.usage.completion_tokens += len(sub.resumed_token_ids)
