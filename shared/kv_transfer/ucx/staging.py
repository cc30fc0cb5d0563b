"""Reusable byte buffers for packing and receiving KV payloads, bounded in bytes.

KVSender packs each payload into a buffer from its pool, KVReceiver receives each payload into
one from its pool (page-locked when a GPU is present). Reusing buffers matters: writing into
fresh memory page-faults and runs ~10x slower than writing into memory touched before. Two
rules keep the pool from growing the process:
  * sizes are rounded up to size classes (powers of two in quarter steps, >= 64 KiB, at most
    25% waste), so payloads of many lengths share a few buffers;
  * every buffer is its own anonymous mmap, outside glibc's heaps: a buffer dropped from the
    pool goes back to the kernel at once instead of leaving a hole in a heap that the raised
    malloc thresholds (shared.model.cpu_runtime) would keep resident.
Free buffers are kept up to `max_free_bytes`; past that the least recently released go.
"""

import mmap
from collections import OrderedDict

import torch

from shared.kv_transfer.ucx.device_copy import new_staging_buffer

MIN_CLASS_BYTES = 64 << 10
DEFAULT_MAX_FREE_BYTES = 256 << 20


def size_class(num_bytes: int) -> int:
    """The smallest class >= num_bytes: 2^k, 1.25 * 2^k, 1.5 * 2^k or 1.75 * 2^k bytes."""
    if num_bytes <= MIN_CLASS_BYTES:
        return MIN_CLASS_BYTES
    quarter = 1 << max(0, (num_bytes - 1).bit_length() - 3)  # a quarter of the power of two below
    return -(-num_bytes // quarter) * quarter


def _new_buffer(num_bytes: int) -> torch.Tensor:
    """Page-locked where a GPU is present; else a 1-D uint8 tensor over an anonymous mmap,
    unmapped when the last view goes."""
    if torch.cuda.is_available():
        return new_staging_buffer(num_bytes)
    return torch.frombuffer(mmap.mmap(-1, num_bytes), dtype=torch.uint8)


class StagingPool:
    """Hands out 1-D uint8 tensors of an exact size, views of retained size-class buffers.

    `acquire(num_bytes)` returns a view of a free buffer of its class (or a new one);
    `release(view)` gives it back; `discard(view)` forgets it (UCX may still touch it).
    Acquire, release and discard from one event loop. The sizes (`num_free_buffers`,
    `free_bytes`, `in_use_bytes`, `memory_bytes`) may be read from any thread: they are counters
    kept as the pool changes, never a walk over its buffers (the engine's status report reads
    them while the UCX thread changes the pool; a walk raised "mutated during iteration").
    """

    def __init__(self, max_free_bytes: int = DEFAULT_MAX_FREE_BYTES):
        self.max_free_bytes = max_free_bytes
        self._free: OrderedDict[int, tuple[int, torch.Tensor]] = OrderedDict()  # id(buffer) -> (class, buffer)
        self._in_use: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(view) -> (view, buffer)
        self._free_bytes = 0
        self._in_use_bytes = 0

    def acquire(self, num_bytes: int) -> torch.Tensor:
        buffer = self._take_free(size_class(num_bytes))
        if buffer is None:
            buffer = _new_buffer(size_class(num_bytes))
        view = buffer[:num_bytes]
        self._in_use[id(view)] = (view, buffer)
        self._in_use_bytes += buffer.numel()
        return view

    def release(self, view: torch.Tensor) -> None:
        _, buffer = self._in_use.pop(id(view))
        self._in_use_bytes -= buffer.numel()
        self._free[id(buffer)] = (buffer.numel(), buffer)
        self._free_bytes += buffer.numel()
        while self._free_bytes > self.max_free_bytes:
            _, (size, _) = self._free.popitem(last=False)
            self._free_bytes -= size

    def discard(self, view: torch.Tensor) -> None:
        """Forget a buffer that must not be reused (e.g. a failed receive may still write to it)."""
        _, buffer = self._in_use.pop(id(view))
        self._in_use_bytes -= buffer.numel()

    @property
    def num_free_buffers(self) -> int:
        return len(self._free)

    @property
    def free_bytes(self) -> int:
        return self._free_bytes

    @property
    def in_use_bytes(self) -> int:
        return self._in_use_bytes

    @property
    def memory_bytes(self) -> int:
        """Bytes of every buffer the pool holds, free or handed out."""
        return self.free_bytes + self.in_use_bytes

    def _take_free(self, class_bytes: int) -> torch.Tensor | None:
        for key, (size, buffer) in self._free.items():
            if size == class_bytes:
                del self._free[key]
                self._free_bytes -= size
                return buffer
        return None
