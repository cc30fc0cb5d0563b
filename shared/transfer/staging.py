"""Reusable byte buffers for packing and receiving payloads.

KVSender packs each payload into a buffer from its pool, KVReceiver receives each payload into
one from its pool (page-locked when a GPU is present). Reusing buffers matters: writing into freshly allocated memory page-faults
and runs ~10x slower than writing into memory that has been touched before.
"""

import torch

from shared.transfer.device_copy import new_staging_buffer


class StagingPool:
    """Hands out 1-D uint8 tensors of an exact size, backed by retained buffers.

    `acquire(num_bytes)` returns a view of the smallest free buffer that is large enough (or a
    new one); `release(view)` gives it back. Up to `max_free_buffers` free buffers are kept;
    beyond that the smallest are dropped. Not thread-safe: use from one event loop.
    """

    def __init__(self, max_free_buffers: int = 4):
        self._max_free_buffers = max_free_buffers
        self._free_buffers: list[torch.Tensor] = []
        self._in_use: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(view) -> (view, buffer)

    def acquire(self, num_bytes: int) -> torch.Tensor:
        fitting = [i for i, b in enumerate(self._free_buffers) if b.numel() >= num_bytes]
        if fitting:
            smallest = min(fitting, key=lambda i: self._free_buffers[i].numel())
            buffer = self._free_buffers.pop(smallest)
        else:
            buffer = new_staging_buffer(num_bytes)
        view = buffer[:num_bytes]
        self._in_use[id(view)] = (view, buffer)
        return view

    def release(self, view: torch.Tensor) -> None:
        _, buffer = self._in_use.pop(id(view))
        self._free_buffers.append(buffer)
        self._free_buffers.sort(key=torch.Tensor.numel, reverse=True)
        del self._free_buffers[self._max_free_buffers:]

    @property
    def num_free_buffers(self) -> int:
        return len(self._free_buffers)

    def discard(self, view: torch.Tensor) -> None:
        """Forget a buffer that must not be reused (e.g. a failed receive may still write to it)."""
        self._in_use.pop(id(view))
