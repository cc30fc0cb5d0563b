"""Every rank's KV cache shard in a shared-memory file, mapped by its worker and by the engine.

Rank (stage s, tensor rank t) holds the layers of stage s and the KV heads of tensor rank t,
for every block (block tables are the same on every rank). The engine maps the same pages, so
KV transfer can run in the engine process unchanged: `gather` assembles some blocks into the
full layout (what a prefill instance sends), `scatter` writes full-layout blocks into every
shard (what a decode instance received). So instances of different layouts pair freely (a
TP=1 prefill feeds a TP=3 decode): the wire always carries the full layout.
"""

import os
import shutil
import tempfile
from dataclasses import dataclass, replace

import torch

from shared.kv_cache.layout import KVCacheLayout
from shared.parallel.config import stage_layers

SHM_FOLDER = "/dev/shm"


@dataclass(frozen=True)
class KVShard:
    path: str
    layers: range
    kv_heads: range
    layout: KVCacheLayout


def map_shard(shard: KVShard) -> torch.Tensor:
    """The shard's tensor, backed by its shared file (created zero-filled on first mapping)."""
    numel = 1
    for size in shard.layout.shape:
        numel *= size
    return torch.from_file(shard.path, shared=True, size=numel, dtype=shard.layout.dtype).view(shard.layout.shape)


def shard_of_rank(folder: str, layout: KVCacheLayout, tensor_parallel_size: int, pipeline_parallel_size: int,
                  rank: int) -> KVShard:
    """Where rank `rank`'s part of the full `layout` lives (the engine and the worker both ask)."""
    stage, tensor_rank = divmod(rank, tensor_parallel_size)
    layers = stage_layers(layout.num_layers, pipeline_parallel_size, stage)
    heads_per_rank = layout.num_kv_heads // tensor_parallel_size
    heads = range(tensor_rank * heads_per_rank, (tensor_rank + 1) * heads_per_rank)
    return KVShard(os.path.join(folder, f"rank{rank}"), layers, heads,
                   replace(layout, num_layers=len(layers), num_kv_heads=heads_per_rank))


class SharedKVShards:
    def __init__(self, layout: KVCacheLayout, tensor_parallel_size: int, pipeline_parallel_size: int):
        self.layout = layout
        self.folder = tempfile.mkdtemp(prefix="pdserve-kv-", dir=SHM_FOLDER if os.path.isdir(SHM_FOLDER) else None)
        self.shards = [shard_of_rank(self.folder, layout, tensor_parallel_size, pipeline_parallel_size, rank)
                       for rank in range(tensor_parallel_size * pipeline_parallel_size)]
        self.tensors = [map_shard(shard) for shard in self.shards]

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        """The blocks' KV in the full layout, (2, layers, len(block_ids), block_size, kv_heads, head_dim)."""
        index = torch.tensor(block_ids, dtype=torch.long)
        shape = list(self.layout.shape)
        shape[2] = len(block_ids)
        full = torch.empty(shape, dtype=self.layout.dtype)
        for shard, tensor in zip(self.shards, self.tensors):
            heads = slice(shard.kv_heads.start, shard.kv_heads.stop)
            full[:, shard.layers.start:shard.layers.stop, :, :, heads] = tensor.index_select(2, index)
        return full

    def scatter(self, source: torch.Tensor, block_ids: list[int]) -> None:
        """Copy the blocks of a full-layout cache `source` into every shard."""
        index = torch.tensor(block_ids, dtype=torch.long)
        for shard, tensor in zip(self.shards, self.tensors):
            heads = slice(shard.kv_heads.start, shard.kv_heads.stop)
            part = source[:, shard.layers.start:shard.layers.stop].index_select(2, index)[:, :, :, :, heads]
            tensor.index_copy_(2, index, part)

    def close(self) -> None:
        self.tensors = []
        shutil.rmtree(self.folder, ignore_errors=True)
