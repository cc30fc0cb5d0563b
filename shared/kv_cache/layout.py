"""The shape of the paged KV cache, shared by the model runner and the KV transfer code.

One tensor per engine holds every layer's keys and values:

    kv_cache[0 = key | 1 = value, layer, block_id, offset_in_block, kv_head, head_dim]

A block's bytes for one layer and one of K/V are contiguous: `kv_cache[kv, layer, block_id]`
is a (block_size, num_kv_heads, head_dim) slab. Slot = block_id * block_size + offset.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVCacheLayout:
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (2, self.num_layers, self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def description(self) -> str:
        """What two engines must share for a block of one to be a block of the other (besides
        block size and dtype): the axis order and the per-block dimensions, not num_blocks."""
        return (f"kv,layer,block,slot,kv_head,head_dim;layers={self.num_layers};"
                f"kv_heads={self.num_kv_heads};head_dim={self.head_dim}")

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block holds across all layers, keys and values."""
        per_slab = self.block_size * self.num_kv_heads * self.head_dim * self.dtype.itemsize
        return 2 * self.num_layers * per_slab

    def allocate(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(self.shape, dtype=self.dtype, device=device)


def num_blocks_for_budget(memory_bytes: int, bytes_per_block: int) -> int:
    return max(0, memory_bytes // bytes_per_block)
