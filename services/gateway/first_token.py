"""The early first token on the gateway: relayed to the client as soon as the prefill instance
sampled it, then kept out of the Decode stream, which starts from the same token.

The prefill instance sends the token with the text the decode side will make of it (same
detokenizer state, same stop strings: services.prefill.first_token). The Decode stream's first
message is that token's output on the decode side: its token id, logprob and that same text,
plus, when the completion ends there, the text flushed at the end, the finish reason and the
usage. `strip` removes the token and its text from it, so the client gets every token once.

When the prefill instance says the completion ends with the first token, no Decode runs:
`ending_message` ends the completion from the prefill's answer.
"""

import logging
from dataclasses import dataclass

from shared.pb.pdserve.v1 import generation_pb2, instance_pb2

from services.gateway.request_prep import SubRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelayedToken:
    """The first token the client got from the prefill instance."""

    token_id: int
    text: str
    logprobs: generation_pb2.PositionLogprobs | None

    @classmethod
    def of(cls, first: instance_pb2.FirstToken) -> "RelayedToken":
        return cls(first.token_id, first.text, first.logprobs if first.HasField("logprobs") else None)


def early_message(sub: SubRequest, first: instance_pb2.FirstToken) -> generation_pb2.GenerateResponse:
    """The client's first message of the completion: the token, its text and logprobs, and the
    prompt logprobs when asked for."""
    message = generation_pb2.GenerateResponse(request_id=sub.request_id, text=first.text,
                                              token_ids=[first.token_id])
    if first.HasField("logprobs") and sub.params.logprobs is not None:
        message.logprobs.append(first.logprobs)
    if sub.params.prompt_logprobs is not None:
        message.prompt_logprobs.extend(first.prompt_logprobs)
    return message


def strip(message: generation_pb2.GenerateResponse,
          relayed: RelayedToken) -> generation_pb2.GenerateResponse | None:
    """The Decode stream's first message without the relayed token (None when nothing is left)."""
    if not message.token_ids or message.token_ids[0] != relayed.token_id:
        logger.warning("request %s: the Decode stream does not start with the relayed token %d; relayed as is",
                       message.request_id, relayed.token_id)
        return message
    del message.token_ids[0]
    if message.logprobs:
        del message.logprobs[0]
    if message.text.startswith(relayed.text):
        message.text = message.text[len(relayed.text):]
    else:
        logger.warning("request %s: the decode side's text of the first token differs from the prefill "
                       "side's; the client keeps the prefill side's", message.request_id)
        message.text = ""
    is_empty = (not message.token_ids and not message.text and not message.HasField("usage")
                and message.finish_reason == generation_pb2.FINISH_REASON_UNSPECIFIED)
    return None if is_empty else message


def ends_with_first_token(done: instance_pb2.PrefillResponse, relayed: RelayedToken | None) -> bool:
    """The prefill instance found that the completion ends with the token the client got."""
    return relayed is not None and done.HasField("finish_reason") and done.first_token_id == relayed.token_id


def ending_message(sub: SubRequest, done: instance_pb2.PrefillResponse) -> generation_pb2.GenerateResponse:
    """The last message of a completion that ended with its first token: the text held back
    until the end, the finish reason, and the usage (the resumed outputs counted by fix_usage)."""
    message = generation_pb2.GenerateResponse(request_id=sub.request_id, text=done.final_text,
                                              finish_reason=done.finish_reason)
    which = done.WhichOneof("stop_reason")
    if which is not None:
        setattr(message, which, getattr(done, which))
    message.usage.prompt_tokens = len(sub.parent.prompt_token_ids)
    message.usage.completion_tokens = 1
    message.usage.cached_prompt_tokens = done.num_cached_prompt_tokens
    return message
