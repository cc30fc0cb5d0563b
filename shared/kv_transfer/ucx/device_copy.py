"""Gather and scatter a chunk's rows when the KV cache lives in GPU memory.

The wire and its checks stay as on the CPU: each chunk is staged in a host buffer (pinned when
a GPU is present, so the copies are DMA) and UCX sends it from there. The sender gathers a
chunk's blocks on the GPU (`index_select`) and copies them down into their place in the
staging buffer; because UCX sends chunk i on its own thread while the event loop stages chunk
i + 1, device-to-host copies overlap the sends. The receiver copies each received chunk up and
writes its blocks in place with `index_copy_`. Sending straight from GPU memory over UCX's
CUDA transports is not used: no ucxx build with them was available to test.

Both functions are plain torch and also run on CPU tensors (the unit tests check them against
the numpy path in chunks.py that CPU caches take).
"""

import numpy as np
import torch

from shared.kv_cache.layout import KVCacheLayout

_SAME_SIZE_INTS = {2: torch.int16, 4: torch.int32}


def cache_rows(kv_cache: torch.Tensor, layout: KVCacheLayout) -> torch.Tensor:
    """The cache as (2 * num_layers rows, num_blocks, slab elements) same-size integers (exact bits)."""
    return kv_cache.view(_SAME_SIZE_INTS[layout.dtype.itemsize]).view(2 * layout.num_layers, layout.num_blocks, -1)


def gather_rows_to_host(kv_cache: torch.Tensor, layout: KVCacheLayout, block_ids: np.ndarray,
                        first_row: int, end_row: int, out: np.ndarray) -> None:
    """Copy rows [first_row, end_row) of blocks `block_ids` into `out` (host, (rows, n, slab) ints)."""
    ids = torch.as_tensor(block_ids, dtype=torch.long).to(kv_cache.device)
    gathered = cache_rows(kv_cache, layout)[first_row:end_row].index_select(1, ids)
    torch.from_numpy(out).copy_(gathered)


def scatter_rows_from_host(rows: np.ndarray, kv_cache: torch.Tensor, layout: KVCacheLayout,
                           block_ids: np.ndarray, first_row: int, end_row: int) -> None:
    """Write host `rows` ((rows, n, slab) ints) into rows [first_row, end_row) of blocks `block_ids`.
    Returns once the host buffer may be reused."""
    device_rows = torch.from_numpy(rows).to(kv_cache.device)
    ids = torch.as_tensor(block_ids, dtype=torch.long).to(kv_cache.device)
    cache_rows(kv_cache, layout)[first_row:end_row].index_copy_(1, ids, device_rows)


def is_device_cache(kv_cache: torch.Tensor) -> bool:
    return kv_cache.device.type != "cpu"


def new_staging_buffer(num_bytes: int) -> torch.Tensor:
    """A host byte buffer, page-locked when a GPU is present (fast, asynchronous-capable DMA)."""
    return torch.empty(num_bytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
