"""Rotary position embedding ("rotate half" layout, as HF Llama), applied in place.

One program per token rotates all of its query and key heads: with x = (x1, x2) split into
halves, x becomes (x1 cos - x2 sin, x2 cos + x1 sin), the angles read from float32 tables at
the token's position.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kernel(x, positions, cos_table, sin_table, stride_token, stride_head, stride_table,
                   num_heads, half_dim, HEADS: tl.constexpr, HALF: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions + token)
    heads = tl.arange(0, HEADS)
    pairs = tl.arange(0, HALF)
    pair_ok = pairs < half_dim
    cos = tl.load(cos_table + position * stride_table + pairs, mask=pair_ok, other=0.0)[None, :]
    sin = tl.load(sin_table + position * stride_table + pairs, mask=pair_ok, other=0.0)[None, :]
    mask = (heads < num_heads)[:, None] & pair_ok[None, :]
    first = x + token * stride_token + heads[:, None] * stride_head + pairs[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + half_dim, mask=mask, other=0.0).to(tl.float32)
    tl.store(first, (x1 * cos - x2 * sin).to(x.dtype.element_ty), mask=mask)
    tl.store(first + half_dim, (x2 * cos + x1 * sin).to(x.dtype.element_ty), mask=mask)


def apply_rotary_inplace(x: torch.Tensor, positions: torch.Tensor, cos_table: torch.Tensor,
                         sin_table: torch.Tensor) -> torch.Tensor:
    """x (num_tokens, num_heads, head_dim), last dim contiguous, rotated in place and returned;
    positions (num_tokens,) int; cos_table/sin_table (max_positions, head_dim // 2) float32."""
    num_tokens, num_heads, head_dim = x.shape
    if x.stride(2) != 1 or cos_table.stride() != sin_table.stride():
        raise ValueError("x: head_dim must be contiguous; cos/sin tables must share strides")
    if num_tokens == 0:
        return x
    half_dim = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        x, positions, cos_table, sin_table, x.stride(0), x.stride(1), cos_table.stride(0), num_heads, half_dim,
        HEADS=triton.next_power_of_2(num_heads), HALF=triton.next_power_of_2(half_dim))
    return x
