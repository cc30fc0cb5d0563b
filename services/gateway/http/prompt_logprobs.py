"""Logprobs of prompt tokens in the two shapes clients read them in.

The gateway's first message carries `prompt_logprobs`: entry i scores prompt token i+1 (the
first token has no logprob). vLLM's `prompt_logprobs` field: one item per prompt token, None
for the first, else `{token id (as text): {"logprob", "rank", "decoded_token"}}` holding the
prompt token and the top alternatives (rank: 1-based among the alternatives; null for a
prompt token outside them, whose rank is not computed). Completions `echo` with `logprobs`:
the prompt's part of OpenAI's completions shape, with null for the first token.
"""

from collections.abc import Sequence

from shared.pb.pdserve.v1 import generation_pb2

from services.gateway.http.logprobs import TokenTexts, finite


def vllm_prompt_logprobs(entries: Sequence[generation_pb2.PositionLogprobs], texts: TokenTexts,
                         num_top: int) -> list[dict | None]:
    """vLLM's field; `num_top` alternatives per position besides the prompt token."""
    return [None] + [_position(entry, texts, num_top) for entry in entries]


def _position(entry: generation_pb2.PositionLogprobs, texts: TokenTexts, num_top: int) -> dict:
    tops = list(entry.top[:num_top])
    ranks = {other.token_id: rank for rank, other in enumerate(tops, start=1)}
    position = {str(entry.token_id): _logprob(entry.token_id, entry.logprob, ranks.get(entry.token_id), texts)}
    for other in tops:
        position.setdefault(str(other.token_id), _logprob(other.token_id, other.logprob,
                                                          ranks[other.token_id], texts))
    return position


def _logprob(token_id: int, logprob: float, rank: int | None, texts: TokenTexts) -> dict:
    return {"logprob": finite(logprob), "rank": rank, "decoded_token": texts(token_id)}


def echoed_prompt_logprobs(prompt_token_ids: Sequence[int], entries: Sequence[generation_pb2.PositionLogprobs],
                           texts: TokenTexts, num_top: int) -> dict:
    """The prompt's part of a completion's `logprobs` (offsets from 0, the start of the echo)."""
    tokens = [texts(token_id) for token_id in prompt_token_ids]
    offsets, offset = [], 0
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    top: list[dict | None] = [None]
    for entry in entries:
        alternatives = {texts(entry.token_id): finite(entry.logprob)}
        for other in entry.top[:num_top]:
            alternatives.setdefault(texts(other.token_id), finite(other.logprob))
        top.append(alternatives)
    return {"tokens": tokens, "token_logprobs": [None] + [finite(entry.logprob) for entry in entries],
            "top_logprobs": top, "text_offset": offsets}


def concatenated(first: dict, second: dict) -> dict:
    """Two completions-shape logprobs one after the other (offsets already absolute)."""
    return {key: first[key] + second[key] for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
