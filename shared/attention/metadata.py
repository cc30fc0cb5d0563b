"""What the attention backend needs to know about one flat batch of tokens.

A step's batch is laid out decodes first, then prefill chunks:

    rows [0, num_decode_tokens)            one token per decoding sequence
    rows [num_decode_tokens, num_tokens)   one contiguous chunk per prefilling sequence

A "prefill chunk" covers fresh prompts, chunks of long prompts and the uncached tail of
prefix-cache hits alike: each sequence attends to `context_len` tokens, the last
`query_len` of which are the new rows.
"""

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    # (num_tokens,) int64: flat cache slot (block_id * block_size + offset) of each new token.
    slot_mapping: torch.Tensor
    # Number of leading rows that are single-token decodes.
    num_decode_tokens: int
    # (num_decodes, max_num_blocks) int64 block tables of the decodes, right-padded with 0.
    decode_block_tables: torch.Tensor
    # (num_decodes,) int64 context length of each decode, counting its new token.
    decode_context_lens: torch.Tensor
    # One entry per prefilling sequence, in row order.
    prefill_query_lens: list[int]
    prefill_context_lens: list[int]
    # Each a (num_blocks,) int64 block table covering that sequence's context.
    prefill_block_tables: list[torch.Tensor]
