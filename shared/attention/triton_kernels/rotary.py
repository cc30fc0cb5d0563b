"""Rotary position embedding ("rotate half" layout, as HF Llama), applied in place.

One program rotates all query and key heads of a few tokens: with x = (x1, x2) split into
halves, x becomes (x1 cos - x2 sin, x2 cos + x1 sin), the angles read from float32 tables at
each token's position.
"""

import torch
import triton
import triton.language as tl

TOKENS_PER_PROGRAM = 4


@triton.jit
def _rotary_kernel(x, positions, cos_table, sin_table, num_tokens, stride_token, stride_head, stride_table,
                   num_heads, half_dim, TOKENS: tl.constexpr, HEADS: tl.constexpr, HALF: tl.constexpr):
    tokens = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    token_ok = tokens < num_tokens
    position = tl.load(positions + tokens, mask=token_ok, other=0).to(tl.int64)
    heads = tl.arange(0, HEADS)
    pairs = tl.arange(0, HALF)
    table_mask = token_ok[:, None] & (pairs < half_dim)[None, :]
    table_rows = position[:, None] * stride_table + pairs[None, :]
    cos = tl.load(cos_table + table_rows, mask=table_mask, other=0.0)[:, None, :]
    sin = tl.load(sin_table + table_rows, mask=table_mask, other=0.0)[:, None, :]
    mask = table_mask[:, None, :] & (heads < num_heads)[None, :, None]
    first = (x + tokens.to(tl.int64)[:, None, None] * stride_token + heads[None, :, None] * stride_head
             + pairs[None, None, :])
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + half_dim, mask=mask, other=0.0).to(tl.float32)
    tl.store(first, (x1 * cos - x2 * sin).to(x.dtype.element_ty), mask=mask)
    tl.store(first + half_dim, (x2 * cos + x1 * sin).to(x.dtype.element_ty), mask=mask)


def apply_rotary_inplace(x: torch.Tensor, positions: torch.Tensor, cos_table: torch.Tensor,
                         sin_table: torch.Tensor) -> torch.Tensor:
    """x (num_tokens, num_heads, head_dim), last dim contiguous, rotated in place and returned;
    positions (num_tokens,) int; cos_table/sin_table (max_positions, head_dim // 2) float, rows
    with the same stride."""
    num_tokens, num_heads, head_dim = x.shape
    if x.stride(2) != 1 or cos_table.stride() != sin_table.stride():
        raise ValueError("x: head_dim must be contiguous; cos/sin tables must share strides")
    if num_tokens == 0:
        return x
    half_dim = head_dim // 2
    _rotary_kernel[(triton.cdiv(num_tokens, TOKENS_PER_PROGRAM),)](
        x, positions, cos_table, sin_table, num_tokens, x.stride(0), x.stride(1), cos_table.stride(0), num_heads,
        half_dim, TOKENS=TOKENS_PER_PROGRAM, HEADS=triton.next_power_of_2(num_heads),
        HALF=triton.next_power_of_2(half_dim))
    return x
