"""Store a step's new keys and values at their cache slots (slot = block_id * block_size + offset).

One program per token writes that token's (num_kv_heads, head_dim) rows of the key and value
caches; a negative slot (a padded row) is skipped.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(key, value, key_cache, value_cache, slot_mapping,
                     stride_key_token, stride_value_token,
                     stride_cache_block, stride_cache_offset,
                     block_size, row_size, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping + token)
    if slot >= 0:
        cache_row = (slot // block_size) * stride_cache_block + (slot % block_size) * stride_cache_offset
        columns = tl.arange(0, BLOCK)
        inside = columns < row_size
        key_row = tl.load(key + token * stride_key_token + columns, mask=inside)
        value_row = tl.load(value + token * stride_value_token + columns, mask=inside)
        tl.store(key_cache + cache_row + columns, key_row.to(key_cache.dtype.element_ty), mask=inside)
        tl.store(value_cache + cache_row + columns, value_row.to(value_cache.dtype.element_ty), mask=inside)


def store_kv(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """key/value (T, num_kv_heads, head_dim); caches (num_blocks, block_size, num_kv_heads,
    head_dim) with each (num_kv_heads, head_dim) row contiguous; slot_mapping (T,) int."""
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    key, value = key.reshape(num_tokens, -1), value.reshape(num_tokens, -1)
    if key.stride(1) != 1 or value.stride(1) != 1:
        key, value = key.contiguous(), value.contiguous()
    _check_cache_rows(key_cache, value_cache)
    row_size = key.shape[1]
    _store_kv_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping, key.stride(0), value.stride(0),
        key_cache.stride(0), key_cache.stride(1), key_cache.shape[1], row_size,
        BLOCK=triton.next_power_of_2(row_size))


def _check_cache_rows(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    if key_cache.stride() != value_cache.stride():
        raise ValueError("key_cache/value_cache: strides differ")
    if key_cache.stride(3) != 1 or key_cache.stride(2) != key_cache.shape[3]:
        raise ValueError("key_cache: each slot's (num_kv_heads, head_dim) row must be contiguous")
