"""The GPU staging path of the KV transfer (shared/kv_transfer/ucx/device_copy.py), run on CPU tensors:
a payload gathered and scattered through it is bit-identical to the numpy path CPU caches take,
chunk by chunk, checksums included."""

import numpy as np
import pytest
import torch

from shared.kv_cache.layout import KVCacheLayout
from shared.kv_transfer.ucx import chunks
from shared.kv_transfer.ucx.chunks import gather_chunk, plan_chunks, scatter_chunk, staging_bytes
from shared.kv_transfer.ucx.device_copy import cache_rows

SRC_BLOCKS = np.array([7, 2, 5], dtype=np.int64)
DST_BLOCKS = np.array([0, 9, 3], dtype=np.int64)


def random_cache(layout: KVCacheLayout, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(layout.shape, generator=generator).to(layout.dtype)


def staged_payload(kv_cache: torch.Tensor, layout: KVCacheLayout, as_device: bool, monkeypatch) -> np.ndarray:
    monkeypatch.setattr(chunks, "is_device_cache", lambda tensor: as_device)
    planned = plan_chunks(layout, len(SRC_BLOCKS), rows_per_chunk=3, has_crc32=True)
    staging = np.zeros(staging_bytes(planned), dtype=np.uint8)
    for chunk in planned:
        message = staging[chunk.message_offset:chunk.message_offset + chunk.message_bytes]
        gather_chunk(kv_cache, layout, SRC_BLOCKS, chunk, message, has_crc32=True)
    return staging


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_device_path_stages_the_same_bytes_and_scatters_them_back(dtype, monkeypatch):
    layout = KVCacheLayout(num_layers=4, num_blocks=12, block_size=4, num_kv_heads=2, head_dim=8, dtype=dtype)
    source = random_cache(layout, seed=0)
    staged_by_numpy = staged_payload(source, layout, as_device=False, monkeypatch=monkeypatch)
    staged_by_torch = staged_payload(source, layout, as_device=True, monkeypatch=monkeypatch)
    assert np.array_equal(staged_by_numpy, staged_by_torch)

    destination = random_cache(layout, seed=1)
    untouched_before = destination.clone()
    for chunk in plan_chunks(layout, len(SRC_BLOCKS), rows_per_chunk=3, has_crc32=True):
        message = staged_by_torch[chunk.message_offset:chunk.message_offset + chunk.message_bytes]
        scatter_chunk(message, destination, layout, DST_BLOCKS, chunk)
    source_rows, destination_rows = cache_rows(source, layout), cache_rows(destination, layout)
    assert torch.equal(destination_rows[:, DST_BLOCKS], source_rows[:, SRC_BLOCKS])
    others = [block for block in range(layout.num_blocks) if block not in DST_BLOCKS]
    assert torch.equal(destination_rows[:, others], cache_rows(untouched_before, layout)[:, others])
