"""Paged attention in plain torch, the CPU backend.

Every layer first stores the step's new keys/values at their cache slots, then reads each
sequence's whole context back THROUGH its block table: earlier prompt chunks and prefix-cache
hits exist only in the cache.

Decodes (one query row per sequence) run batched, with no Python loop over sequences: the
blocks of all decodes are gathered at once with `index_select` over whole blocks (each block
is a contiguous slab, so this is a memcpy per block), key positions past a sequence's context
are masked, and two batched matmuls do the rest. With few KV heads the "flat" kernel treats a
sequence's (position, kv_head) rows as one key matrix and masks the other heads' columns: the
wasted multiply-adds cost less than the copies a per-head layout would need. Prefill chunks run
one sequence at a time (a step has few) through `scaled_dot_product_attention`.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shared.attention.backend import AttentionBackend
from shared.attention.metadata import AttentionMetadata

# Above this many KV heads the flat kernel's masked-out work outgrows its savings.
FLAT_DECODE_MAX_KV_HEADS = 4


@dataclass
class DecodeBatch:
    num_seqs: int
    # (num_seqs * num_blocks,) the block tables, right-padded and flattened.
    block_ids: torch.Tensor
    # Key positions per sequence after padding: num_blocks * block_size.
    padded_len: int
    # Additive 0 / -inf mask. Flat kernel: (num_seqs, num_heads, padded_len * num_kv_heads);
    # grouped kernel: (num_seqs, 1, 1, padded_len).
    score_bias: torch.Tensor


@dataclass
class PrefillChunk:
    first_row: int
    query_len: int
    context_len: int
    # (ceil(context_len / block_size),) the blocks holding the context.
    block_ids: torch.Tensor
    # (query_len, context_len) bool, True where a row may attend; None when the chunk is the
    # whole context, so plain causal attention applies.
    causal_mask: torch.Tensor | None


@dataclass
class TorchPagedStep:
    slot_mapping: torch.Tensor
    decode: DecodeBatch | None
    prefills: list[PrefillChunk]


class TorchPagedAttention(AttentionBackend):
    """CPU paged attention. `flat_decode` picks the decode kernel (None: by KV head count)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, flat_decode: bool | None = None):
        super().__init__(num_heads, num_kv_heads, head_dim)
        self.num_queries_per_kv = num_heads // num_kv_heads
        self.flat_decode = num_kv_heads <= FLAT_DECODE_MAX_KV_HEADS if flat_decode is None else flat_decode

    def prepare(self, metadata: AttentionMetadata, block_size: int, dtype: torch.dtype) -> TorchPagedStep:
        decode = None
        if metadata.num_decode_tokens:
            decode = self._prepare_decode(metadata, block_size, dtype)
        return TorchPagedStep(metadata.slot_mapping, decode, _prepare_prefills(metadata, block_size))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_cache: torch.Tensor, value_cache: torch.Tensor, step: TorchPagedStep) -> torch.Tensor:
        _store(key, value, key_cache, value_cache, step.slot_mapping)
        decode = step.decode
        if decode is not None and not step.prefills:
            return self._decode(query, key_cache, value_cache, decode)
        output = query.new_empty(query.shape)
        if decode is not None:
            output[:decode.num_seqs] = self._decode(query[:decode.num_seqs], key_cache, value_cache, decode)
        for chunk in step.prefills:
            rows = slice(chunk.first_row, chunk.first_row + chunk.query_len)
            output[rows] = self._prefill(query[rows], key_cache, value_cache, chunk)
        return output

    def _decode(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                batch: DecodeBatch) -> torch.Tensor:
        """(num_seqs, num_heads, head_dim) queries, one per sequence -> outputs, same shape."""
        num_seqs, padded_len = batch.num_seqs, batch.padded_len
        keys = key_cache.index_select(0, batch.block_ids)
        values = value_cache.index_select(0, batch.block_ids)
        if self.flat_decode:
            keys = keys.view(num_seqs, padded_len * self.num_kv_heads, self.head_dim)
            values = values.view(num_seqs, padded_len * self.num_kv_heads, self.head_dim)
            scores = torch.baddbmm(batch.score_bias, query, keys.transpose(1, 2), alpha=self.scale)
            return torch.bmm(torch.softmax(scores, dim=-1), values)
        grouped_shape = (num_seqs, padded_len, self.num_kv_heads, self.head_dim)
        output = F.scaled_dot_product_attention(
            query.view(num_seqs, self.num_kv_heads, self.num_queries_per_kv, self.head_dim),
            keys.view(grouped_shape).transpose(1, 2), values.view(grouped_shape).transpose(1, 2),
            attn_mask=batch.score_bias, scale=self.scale)
        return output.view(num_seqs, self.num_heads, self.head_dim)

    def _prefill(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 chunk: PrefillChunk) -> torch.Tensor:
        """(query_len, num_heads, head_dim) rows of one sequence -> outputs, same shape."""
        keys = key_cache.index_select(0, chunk.block_ids).flatten(0, 1)[:chunk.context_len]
        values = value_cache.index_select(0, chunk.block_ids).flatten(0, 1)[:chunk.context_len]
        output = F.scaled_dot_product_attention(
            query.transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0), attn_mask=chunk.causal_mask,
            is_causal=chunk.causal_mask is None, scale=self.scale, enable_gqa=True)
        return output[0].transpose(0, 1)

    def _prepare_decode(self, metadata: AttentionMetadata, block_size: int, dtype: torch.dtype) -> DecodeBatch:
        context_lens = metadata.decode_context_lens
        num_blocks = -(-int(context_lens.max()) // block_size)
        block_ids = metadata.decode_block_tables[:, :num_blocks].reshape(-1)
        padded_len = num_blocks * block_size
        is_in_context = torch.arange(padded_len) < context_lens[:, None]
        if self.flat_decode:
            score_bias = _additive_mask(self._flat_allowed(is_in_context), dtype)
        else:
            score_bias = _additive_mask(is_in_context[:, None, None, :], dtype)
        return DecodeBatch(len(context_lens), block_ids, padded_len, score_bias)

    def _flat_allowed(self, is_in_context: torch.Tensor) -> torch.Tensor:
        """(num_seqs, num_heads, padded_len * num_kv_heads): the position is in context and the
        column's KV head is the one this query head reads."""
        kv_head_of_query = torch.arange(self.num_heads) // self.num_queries_per_kv
        is_own_kv_head = kv_head_of_query[:, None] == torch.arange(self.num_kv_heads)
        allowed = is_in_context[:, None, :, None] & is_own_kv_head[None, :, None, :]
        return allowed.flatten(2)


def _store(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
           slot_mapping: torch.Tensor) -> None:
    """Write each new token's key/value at its slot (block_id * block_size + offset)."""
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slot_mapping, value)


def _prepare_prefills(metadata: AttentionMetadata, block_size: int) -> list[PrefillChunk]:
    chunks = []
    first_row = metadata.num_decode_tokens
    for query_len, context_len, block_table in zip(
            metadata.prefill_query_lens, metadata.prefill_context_lens, metadata.prefill_block_tables):
        num_blocks = math.ceil(context_len / block_size)
        causal_mask = None if query_len == context_len else _offset_causal_mask(query_len, context_len)
        chunks.append(PrefillChunk(first_row, query_len, context_len, block_table[:num_blocks], causal_mask))
        first_row += query_len
    return chunks


def _offset_causal_mask(query_len: int, context_len: int) -> torch.Tensor:
    """Row i (context position context_len - query_len + i) sees positions up to its own."""
    row_positions = torch.arange(context_len - query_len, context_len)
    return torch.arange(context_len)[None, :] <= row_positions[:, None]


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))
