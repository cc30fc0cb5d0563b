"""An instance's memory split by component: what the Prometheus gauge
`pdserve:memory_bytes{component}` reports next to `process_resident_memory_bytes`.

  weights         model parameters and buffers (packed weights included), draft model too
  kv_pool         the paged KV cache tensor(s)
  staging         KV-transfer staging buffers retained by the sender and receiver pools
  caches          bounded caches that report their size (`SizedCache` below)
  allocator_free  bytes glibc holds free inside its heaps (reusable; fragmentation shows here)
  other           the rest of the resident set (interpreter, libraries, live temporaries)
"""

from collections.abc import Iterable
from typing import Protocol

import torch

from shared.memory.malloc_stats import malloc_stats
from shared.memory.process import resident_bytes

COMPONENTS = ("weights", "kv_pool", "staging", "caches", "allocator_free", "other")


class SizedCache(Protocol):
    """A bounded cache that can say how many bytes it holds (approximately)."""

    @property
    def memory_bytes(self) -> int: ...


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (shared/tied storages counted once)."""
    seen, total = set(), 0
    for tensor in tensors:
        try:
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # opaque (e.g. mkldnn) tensors
            key, size = id(tensor), tensor.numel() * tensor.element_size()
        if key not in seen:
            seen.add(key)
            total += size
    return total


def module_bytes(module: torch.nn.Module | None) -> int:
    if module is None:
        return 0
    return tensor_bytes([*module.parameters(), *(b for b in module.buffers() if b is not None)])


def memory_by_component(weights: int, kv_pool: int, staging: int, caches: int) -> dict[str, int]:
    """Every component's bytes; `other` is what the resident set holds beyond the rest (>= 0)."""
    stats = malloc_stats()
    allocator_free = stats.free_bytes if stats is not None else 0
    known = {"weights": weights, "kv_pool": kv_pool, "staging": staging, "caches": caches,
             "allocator_free": allocator_free}
    known["other"] = max(0, resident_bytes() - sum(known.values()))
    return known
