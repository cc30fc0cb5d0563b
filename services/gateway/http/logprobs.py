"""Logprobs of generated tokens in the two OpenAI shapes.

Completions: `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}`
(each dict holds the sampled token and its top alternatives). Chat: `{"content": [{"token",
"logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`. Token strings are
the tokens decoded one by one; logprobs of -inf become -9999.0, since JSON has no infinity.
"""

import math
from collections.abc import Sequence

from shared.pb.pdserve.v1 import generation_pb2

MIN_LOGPROB = -9999.0


class TokenTexts:
    """token id -> its text, decoded once per id (one per response)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        if token_id not in self._texts:
            self._texts[token_id] = self.tokenizer.decode([token_id])
        return self._texts[token_id]


def finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else MIN_LOGPROB


def completion_logprobs(entries: Sequence[generation_pb2.PositionLogprobs], texts: TokenTexts,
                        first_offset: int) -> dict:
    """`first_offset`: where the first token's text starts in the completion's text."""
    tokens = [texts(entry.token_id) for entry in entries]
    offsets, offset = [], first_offset
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    top = []
    for entry in entries:
        alternatives = {texts(entry.token_id): finite(entry.logprob)}
        for other in entry.top:
            alternatives.setdefault(texts(other.token_id), finite(other.logprob))
        top.append(alternatives)
    return {"tokens": tokens, "token_logprobs": [finite(entry.logprob) for entry in entries],
            "top_logprobs": top, "text_offset": offsets}


def _token_entry(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": finite(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: Sequence[generation_pb2.PositionLogprobs], texts: TokenTexts,
                  num_top: int) -> dict:
    content = []
    for entry in entries:
        item = _token_entry(texts(entry.token_id), entry.logprob)
        item["top_logprobs"] = [_token_entry(texts(other.token_id), other.logprob)
                                for other in entry.top[:num_top]]
        content.append(item)
    return {"content": content}
