"""Checks a request must pass before it may wait for the scheduler.

A request that could never run (too long for the model or for the whole KV cache) is
rejected here with an error naming the field, instead of waiting forever.
"""

from collections.abc import Sequence

from shared.errors import InvalidRequestError
from shared.kv_cache.blocks import blocks_for_tokens
from shared.sampling.params import SamplingParams


def validate_prompt_tokens(token_ids: Sequence[int], vocab_size: int, max_model_len: int) -> None:
    if len(token_ids) == 0:
        raise InvalidRequestError("prompt", "must not be empty")
    bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError("prompt", f"token id {bad[0]!r} is outside the vocabulary [0, {vocab_size})")
    if len(token_ids) >= max_model_len:
        raise InvalidRequestError(
            "prompt", f"{len(token_ids)} tokens leave no room to generate: the model's limit is {max_model_len}")


def max_output_tokens(num_prompt_tokens: int, params: SamplingParams, max_model_len: int,
                      num_blocks: int, block_size: int) -> int:
    """max_tokens clipped to the model length; an error if the KV cache can never hold it."""
    limit = max_model_len - num_prompt_tokens
    wanted = limit if params.max_tokens is None else min(params.max_tokens, limit)
    cache_tokens = num_blocks * block_size
    if blocks_for_tokens(num_prompt_tokens + 1, block_size) > num_blocks:
        raise InvalidRequestError(
            "prompt", f"{num_prompt_tokens} tokens do not fit in the KV cache ({cache_tokens} token slots)")
    if blocks_for_tokens(num_prompt_tokens + wanted, block_size) <= num_blocks:
        return wanted
    if params.max_tokens is None:
        return cache_tokens - num_prompt_tokens
    raise InvalidRequestError(
        "max_tokens", f"prompt ({num_prompt_tokens} tokens) + max_tokens ({params.max_tokens}) exceed "
                      f"the KV cache ({cache_tokens} token slots)")
