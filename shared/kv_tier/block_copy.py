"""Copies between the engine's paged KV cache and arena slots (one block per slot).

A slot holds one block in the cache's own dtype, laid out (2 * num_layers, block_size *
num_kv_heads * head_dim): keys then values, layer by layer. CPU caches are copied with numpy
on same-size integers (exact bits, no OpenMP pool spinning against the engine's threads); a
cache in GPU memory goes through torch (device to host and back).
"""

import numpy as np
import torch

from shared.kv_cache.layout import KVCacheLayout

_SAME_SIZE_INTS = {1: (torch.uint8, np.uint8), 2: (torch.int16, np.int16), 4: (torch.int32, np.int32)}


def _rows(kv_cache: torch.Tensor, layout: KVCacheLayout) -> np.ndarray:
    """A CPU cache as (2 * num_layers, num_blocks, elements per block slab) of same-size ints."""
    torch_int, _ = _SAME_SIZE_INTS[layout.dtype.itemsize]
    return kv_cache.view(torch_int).numpy().reshape(2 * layout.num_layers, layout.num_blocks, -1)


def _slot_rows(slot: np.ndarray, layout: KVCacheLayout) -> np.ndarray:
    _, numpy_int = _SAME_SIZE_INTS[layout.dtype.itemsize]
    return slot.view(numpy_int).reshape(2 * layout.num_layers, -1)


def _slot_tensor(slot: np.ndarray, layout: KVCacheLayout) -> torch.Tensor:
    """A slot as (2, num_layers, block_size, num_kv_heads, head_dim) in the cache's dtype."""
    shape = (2, layout.num_layers, layout.block_size, layout.num_kv_heads, layout.head_dim)
    return torch.from_numpy(slot).view(layout.dtype).view(shape)


def copy_block_to_slot(kv_cache: torch.Tensor, layout: KVCacheLayout, block_id: int, slot: np.ndarray) -> None:
    """Block `block_id` of `kv_cache` (laid out per `layout`) into `slot`'s bytes."""
    if kv_cache.device.type == "cpu":
        np.copyto(_slot_rows(slot, layout), _rows(kv_cache, layout)[:, block_id])
    else:
        _slot_tensor(slot, layout).copy_(kv_cache[:, :, block_id])


def copy_slot_to_block(slot: np.ndarray, kv_cache: torch.Tensor, layout: KVCacheLayout, block_id: int) -> None:
    """`slot`'s bytes into block `block_id` of `kv_cache`."""
    if kv_cache.device.type == "cpu":
        _rows(kv_cache, layout)[:, block_id] = _slot_rows(slot, layout)
    else:
        kv_cache[:, :, block_id].copy_(_slot_tensor(slot, layout))


def slot_bytes(layout: KVCacheLayout) -> int:
    return layout.bytes_per_block
