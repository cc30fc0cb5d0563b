"""Paged decode attention, flash-decoding style: one query row per sequence.

Pass 1 (`_decode_split_kernel`) runs one program per (sequence, KV head, context split): it
reads its slice of the sequence's keys and values through the block table, once for all the
query heads that share the KV head (grouped-query attention), and keeps an online softmax.
It writes each query head's normalized partial output and its log-sum-exp. Pass 2
(`_decode_reduce_kernel`) merges a sequence's splits, weighting each by exp(lse - max lse).
Splitting the context keeps the GPU busy when the batch is small and the contexts are long;
with a single split, pass 1 writes the output itself and pass 2 is skipped.
"""

import torch
import triton
import triton.language as tl

# Key positions each loop iteration of pass 1 reads.
DECODE_BLOCK_N = 32
# Shortest context slice worth its own program.
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 16
# Programs that keep a large GPU busy.
TARGET_PROGRAMS = 512


@triton.jit
def _decode_split_kernel(query, key_cache, value_cache, block_tables, context_lens,
                         partial_out, partial_lse, output, scale, num_splits, block_size,
                         stride_q_seq, stride_q_head, stride_cache_block, stride_cache_offset,
                         stride_cache_head, stride_table, stride_out_seq, stride_out_head,
                         queries_per_kv, head_dim, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_N: tl.constexpr, SINGLE_SPLIT: tl.constexpr):
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    group = tl.arange(0, GROUP)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * queries_per_kv + group
    head_ok = group < queries_per_kv
    dim_ok = dims < head_dim
    q = tl.load(query + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
                mask=head_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
    context_len = tl.load(context_lens + seq)
    per_split = (context_len + num_splits - 1) // num_splits
    split_len = (per_split + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, context_len)
    row_max = tl.full([GROUP], float("-inf"), tl.float32)
    row_sum = tl.zeros([GROUP], tl.float32)
    acc = tl.zeros([GROUP, HEAD_DIM], tl.float32)
    for first in range(start, end, BLOCK_N):
        positions = first + tl.arange(0, BLOCK_N)
        valid = positions < end
        block_ids = tl.load(block_tables + seq * stride_table + positions // block_size, mask=valid, other=0)
        rows = (block_ids.to(tl.int64) * stride_cache_block + (positions % block_size) * stride_cache_offset
                + kv_head * stride_cache_head)
        kv_mask = valid[:, None] & dim_ok[None, :]
        k = tl.load(key_cache + rows[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(value_cache + rows[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        rescale = tl.exp(row_max - new_max)
        probs = tl.exp(scores - new_max[:, None])
        row_sum = row_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None] + tl.sum(probs[:, :, None] * v[None, :, :], axis=1)
        row_max = new_max
    has_keys = row_sum > 0
    safe_sum = tl.where(has_keys, row_sum, 1.0)
    if SINGLE_SPLIT:
        tl.store(output + seq * stride_out_seq + heads[:, None] * stride_out_head + dims[None, :],
                 (acc / safe_sum[:, None]).to(output.dtype.element_ty), mask=head_ok[:, None] & dim_ok[None, :])
    else:
        lse = tl.where(has_keys, row_max + tl.log(safe_sum), float("-inf"))
        out_rows = (seq * tl.num_programs(1) * queries_per_kv + heads) * num_splits + split
        tl.store(partial_lse + out_rows, lse, mask=head_ok)
        tl.store(partial_out + out_rows[:, None] * HEAD_DIM + dims[None, :], acc / safe_sum[:, None],
                 mask=head_ok[:, None])


@triton.jit
def _decode_reduce_kernel(partial_out, partial_lse, output, num_splits, stride_out_seq, stride_out_head,
                          head_dim, SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr):
    seq, head = tl.program_id(0), tl.program_id(1)
    splits = tl.arange(0, SPLITS)
    dims = tl.arange(0, HEAD_DIM)
    split_ok = splits < num_splits
    first_row = (seq * tl.num_programs(1) + head) * num_splits
    lse = tl.load(partial_lse + first_row + splits, mask=split_ok, other=float("-inf"))
    weights = tl.exp(lse - tl.max(lse, axis=0))
    weights = weights / tl.sum(weights, axis=0)
    parts = tl.load(partial_out + (first_row + splits[:, None]) * HEAD_DIM + dims[None, :],
                    mask=split_ok[:, None], other=0.0)
    merged = tl.sum(weights[:, None] * parts, axis=0)
    tl.store(output + seq * stride_out_seq + head * stride_out_head + dims,
             merged.to(output.dtype.element_ty), mask=dims < head_dim)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int) -> int:
    """Enough programs to fill the GPU, but no split shorter than MIN_TOKENS_PER_SPLIT."""
    wanted = triton.cdiv(TARGET_PROGRAMS, max(1, num_seqs * num_kv_heads))
    useful = triton.cdiv(max(1, max_context_len), MIN_TOKENS_PER_SPLIT)
    return max(1, min(wanted, useful, MAX_SPLITS))


def decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                     num_splits: int, output: torch.Tensor | None = None) -> torch.Tensor:
    """query (n, num_heads, head_dim), last dim contiguous; caches (num_blocks, block_size,
    num_kv_heads, head_dim), last dim contiguous; block_tables (n, max_blocks) and
    context_lens (n,) int on the query's device. Returns (n, num_heads, head_dim)."""
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    output = torch.empty_like(query) if output is None else output
    if num_seqs == 0:
        return output
    padded_dim = triton.next_power_of_2(head_dim)
    queries_per_kv = num_heads // num_kv_heads
    single_split = num_splits == 1
    partials = (num_seqs, num_heads, num_splits) if not single_split else (1, 1, 1)
    partial_out = torch.empty((*partials, padded_dim), dtype=torch.float32, device=query.device)
    partial_lse = torch.empty(partials, dtype=torch.float32, device=query.device)
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, key_cache, value_cache, block_tables, context_lens, partial_out, partial_lse, output, scale,
        num_splits, block_size, query.stride(0), query.stride(1), key_cache.stride(0), key_cache.stride(1),
        key_cache.stride(2), block_tables.stride(0), output.stride(0), output.stride(1), queries_per_kv,
        head_dim, GROUP=triton.next_power_of_2(queries_per_kv), HEAD_DIM=padded_dim, BLOCK_N=DECODE_BLOCK_N,
        SINGLE_SPLIT=single_split)
    if single_split:
        return output
    _decode_reduce_kernel[(num_seqs, num_heads)](
        partial_out, partial_lse, output, num_splits, output.stride(0), output.stride(1), head_dim,
        SPLITS=triton.next_power_of_2(num_splits), HEAD_DIM=padded_dim)
    return output
