"""Prefill / extend attention over the paged KV cache: many variable-length chunks in one launch.

Sequence i's new query rows are rows [cu_seqlens[i], cu_seqlens[i + 1]) of the flat batch; it
attends to `context_lens[i]` cached tokens (its new keys already stored), the last
query_len of which are the new rows, so a prefix-cache hit or an earlier chunk is simply a
longer context. One program per (sequence, query head, block of query rows) walks the keys
through the block table with an online softmax, stopping at the causal limit of its last row.
A query head reads the keys of its KV head (grouped-query attention).
"""

import torch
import triton
import triton.language as tl

PREFILL_BLOCK_M = 32
PREFILL_BLOCK_N = 32


@triton.jit
def _prefill_kernel(query, key_cache, value_cache, block_tables, cu_seqlens, context_lens, output,
                    scale, block_size, stride_q_token, stride_q_head, stride_o_token, stride_o_head,
                    stride_cache_block, stride_cache_offset, stride_cache_head, stride_table,
                    queries_per_kv, head_dim, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    seq, head, row_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    first_token = tl.load(cu_seqlens + seq)
    query_len = tl.load(cu_seqlens + seq + 1) - first_token
    if row_block * BLOCK_M < query_len:
        context_len = tl.load(context_lens + seq)
        prefix_len = context_len - query_len
        kv_head = head // queries_per_kv
        rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        row_ok = rows < query_len
        dim_ok = dims < head_dim
        tokens = (first_token + rows).to(tl.int64)
        q = tl.load(query + tokens[:, None] * stride_q_token + head * stride_q_head + dims[None, :],
                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        key_end = tl.minimum(context_len, prefix_len + (row_block + 1) * BLOCK_M)
        for first in range(0, key_end, BLOCK_N):
            positions = first + tl.arange(0, BLOCK_N)
            valid = positions < key_end
            block_ids = tl.load(block_tables + seq * stride_table + positions // block_size, mask=valid, other=0)
            kv_rows = (block_ids.to(tl.int64) * stride_cache_block + (positions % block_size) * stride_cache_offset
                       + kv_head * stride_cache_head)
            kv_mask = valid[:, None] & dim_ok[None, :]
            k = tl.load(key_cache + kv_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
            v = tl.load(value_cache + kv_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            visible = valid[None, :] & (positions[None, :] <= prefix_len + rows[:, None])
            scores = tl.where(visible, scores, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(scores, axis=1))
            rescale = tl.exp(row_max - new_max)
            probs = tl.exp(scores - new_max[:, None])
            row_sum = row_sum * rescale + tl.sum(probs, axis=1)
            acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
            row_max = new_max
        acc = acc / tl.where(row_sum > 0, row_sum, 1.0)[:, None]
        tl.store(output + tokens[:, None] * stride_o_token + head * stride_o_head + dims[None, :],
                 acc.to(output.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def prefill_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      block_tables: torch.Tensor, cu_seqlens: torch.Tensor, context_lens: torch.Tensor,
                      max_query_len: int, scale: float, output: torch.Tensor | None = None) -> torch.Tensor:
    """query (T, num_heads, head_dim) rows of every chunk, last dim contiguous; caches
    (num_blocks, block_size, num_kv_heads, head_dim); block_tables (n, max_blocks) right-padded;
    cu_seqlens (n + 1,) and context_lens (n,) int on the query's device.
    Returns (T, num_heads, head_dim); rows outside every chunk are left untouched."""
    num_heads, head_dim = query.shape[1], query.shape[2]
    _, block_size, num_kv_heads, _ = key_cache.shape
    output = torch.empty_like(query) if output is None else output
    num_seqs = context_lens.shape[0]
    if num_seqs == 0 or max_query_len == 0:
        return output
    grid = (num_seqs, num_heads, triton.cdiv(max_query_len, PREFILL_BLOCK_M))
    _prefill_kernel[grid](
        query, key_cache, value_cache, block_tables, cu_seqlens, context_lens, output, scale, block_size,
        query.stride(0), query.stride(1), output.stride(0), output.stride(1), key_cache.stride(0),
        key_cache.stride(1), key_cache.stride(2), block_tables.stride(0), num_heads // num_kv_heads, head_dim,
        HEAD_DIM=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=PREFILL_BLOCK_M, BLOCK_N=PREFILL_BLOCK_N,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32")
    return output
