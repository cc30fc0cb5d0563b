"""Process-wide CPU settings that make the model's steps fast (`load_model` applies the
allocator setting; `configure_cpu_runtime` also sets the thread count, for benchmarks).

glibc hands every allocation above its mmap threshold (128 KiB at first) straight to the
kernel and gives it back on free, so a step's large temporaries (activations, gathered KV
blocks) page-fault afresh on every step: measured here, a 512-token RMSNorm took 1.4 ms
instead of 0.2 ms. Raising the mmap and trim thresholds keeps freed memory in the process for
reuse; the cost is that the resident size stays at its peak.

oneDNN keeps a compiled primitive (~0.3 MB) per distinct matmul shape in two caches, its own
primitive cache and ideep's LRU cache, each 1,024 entries by default. Both are capped here
(`PDSERVE_ONEDNN_CACHE_CAPACITY`, default 128 entries each; an explicit
ONEDNN_PRIMITIVE_CACHE_CAPACITY or LRU_CACHE_CAPACITY wins). The caps take effect only if set
before the process's first oneDNN matmul, which `load_model` ensures.
"""

import ctypes
import ctypes.util
import logging
import os
import platform

import torch

logger = logging.getLogger(__name__)

# mallopt(3) parameter numbers from glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Older glibc refuses mmap thresholds above 32 MiB; the first value accepted wins.
MMAP_THRESHOLD_CHOICES = (1 << 30, 32 << 20)
TRIM_THRESHOLD = 1 << 30
ONEDNN_CACHE_CAPACITY_VARIABLE = "PDSERVE_ONEDNN_CACHE_CAPACITY"
DEFAULT_ONEDNN_CACHE_CAPACITY = 128
_ONEDNN_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def configure_cpu_runtime(num_threads: int | None = None) -> None:
    """Set torch's intra-op thread count (when given) and keep freed memory for reuse."""
    if num_threads:
        torch.set_num_threads(num_threads)
    bound_onednn_caches()
    keep_freed_memory_in_process()


def onednn_cache_capacity() -> int:
    """Entries each oneDNN shape cache may hold (from PDSERVE_ONEDNN_CACHE_CAPACITY)."""
    text = os.environ.get(ONEDNN_CACHE_CAPACITY_VARIABLE, str(DEFAULT_ONEDNN_CACHE_CAPACITY))
    if not text.isdigit():
        raise ValueError(f"{ONEDNN_CACHE_CAPACITY_VARIABLE}: expected a whole number of entries, got {text!r}")
    return int(text)


def bound_onednn_caches() -> int:
    """Cap oneDNN's primitive cache and ideep's LRU cache (unless set already); returns the cap."""
    capacity = onednn_cache_capacity()
    for name in _ONEDNN_CACHE_VARIABLES:
        os.environ.setdefault(name, str(capacity))
    return capacity


def keep_freed_memory_in_process() -> bool:
    """Raise glibc's mmap/trim thresholds; returns False where libc is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    is_set = any(libc.mallopt(M_MMAP_THRESHOLD, value) for value in MMAP_THRESHOLD_CHOICES)
    is_set = bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and is_set
    logger.debug("glibc malloc thresholds raised: %s", is_set)
    return is_set
