"""The C++ paged attention kernel (csrc/paged_decode.cpp), reached through ctypes.

`TorchPagedAttention` calls `load_native_decode()` once per backend and, when it returns a
kernel that `supports` the model's shapes, runs every decode row through it instead of the
torch gather-and-matmul path: keys and values are read in place through the block table, so
no gathered copy is written and read back, and each key/value row is loaded once for all the
query heads sharing it. Prefill chunks keep the torch path, except in deterministic mode,
which passes each chunk's rows as one segment (`query_lens`): the kernel walks the chunk's
context tiles once for all its rows, each row with the arithmetic it would get alone.

ctypes releases the GIL during the call; the kernel runs on `torch.get_num_threads()` OpenMP
threads (the same libgomp runtime torch loaded).

The kernel has four paths (portable, avx512f, avx512-bf16, amx; csrc/paged_decode.cpp's header
says what each does). By default rows take the fastest one this build has for their shapes;
`PDSERVE_CPU_ATTENTION_PATH=portable|avx512f|avx512-bf16|amx` forces one (an error where it
cannot run those shapes), so every path this machine can execute is testable on it.
"""

import ctypes
import functools
import os
from pathlib import Path

import torch

from shared.errors import ConfigurationError
from shared.native.build import load_library

SOURCE = Path(__file__).parent / "csrc" / "paged_decode.cpp"
_POINTER_ARGS = 7
_INT_ARGS = 6
_ENTRY_POINTS = {torch.bfloat16: "pdserve_paged_attention_bf16", torch.float32: "pdserve_paged_attention_f32"}
# The kernel's path numbers, in order.
PATH_NAMES = ("portable", "avx512f", "avx512-bf16", "amx")
PATH_ENV_VAR = "PDSERVE_CPU_ATTENTION_PATH"


def requested_path() -> str | None:
    """The path PDSERVE_CPU_ATTENTION_PATH forces, or None for the fastest (unset or "auto")."""
    choice = os.environ.get(PATH_ENV_VAR, "auto").strip().lower()
    if choice == "auto":
        return None
    if choice not in PATH_NAMES:
        raise ConfigurationError(PATH_ENV_VAR, f"must be auto or one of {list(PATH_NAMES)}, got {choice!r}")
    return choice


class NativePagedDecode:
    """Attention over a paged KV cache for query rows in segments: a segment is one
    sequence's consecutive rows (a decode row, or a prompt chunk's rows)."""

    def __init__(self, library: ctypes.CDLL):
        self._functions = {}
        for dtype, name in _ENTRY_POINTS.items():
            function = getattr(library, name)
            function.restype = None
            function.argtypes = [ctypes.c_void_p] * _POINTER_ARGS + [ctypes.c_int] * _INT_ARGS + [
                ctypes.c_float, ctypes.c_int, ctypes.c_int]
            self._functions[dtype] = function
        self.max_head_dim = library.pdserve_paged_decode_max_head_dim()
        self.max_queries_per_kv = library.pdserve_paged_decode_max_queries_per_kv()
        self.max_block_size = library.pdserve_paged_decode_max_block_size()
        self._path_available = library.pdserve_paged_attention_path_available
        self._path_available.argtypes = [ctypes.c_int] * 5
        self._store_kv = library.pdserve_store_kv
        self._store_kv.restype = None
        self._store_kv.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                   ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
        self._available: dict[tuple[int, int, int, int], list[str]] = {}

    def supports(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                 dtype: torch.dtype) -> bool:
        return (dtype in self._functions and head_dim <= self.max_head_dim and block_size <= self.max_block_size
                and num_heads % num_kv_heads == 0 and num_heads // num_kv_heads <= self.max_queries_per_kv)

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> bool:
        """Write key/value (T, num_kv_heads, head_dim) rows at their slots of the caches
        (num_blocks, block_size, num_kv_heads, head_dim), as index_copy_ would, in one call;
        False (nothing written) where the layouts do not allow it (the caller then copies)."""
        rows_ok = (key.stride() == value.stride() and key.stride(2) == 1 and key.stride(1) == key.shape[2]
                   and key.dtype == value.dtype == key_cache.dtype and slot_mapping.dtype == torch.int64)
        if not (rows_ok and key_cache.is_contiguous() and value_cache.is_contiguous() and slot_mapping.is_contiguous()):
            return False
        num_tokens = key.shape[0]
        self._store_kv(key.data_ptr(), value.data_ptr(), key.stride(0) * key.element_size(), slot_mapping.data_ptr(),
                       num_tokens, key[0].numel() * key.element_size() if num_tokens else 0, key_cache.data_ptr(),
                       value_cache.data_ptr())
        return True

    def available_paths(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                        dtype: torch.dtype) -> list[str]:
        """The paths this build can run rows of these shapes on, slowest first."""
        key = (num_heads // num_kv_heads, head_dim, block_size, int(dtype == torch.bfloat16))
        if key not in self._available:
            self._available[key] = [name for number, name in enumerate(PATH_NAMES) if self._path_available(number, *key)]
        return self._available[key]

    def path(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype) -> str:
        """The path rows of these shapes take: PDSERVE_CPU_ATTENTION_PATH's, else the fastest."""
        available = self.available_paths(num_heads, num_kv_heads, head_dim, block_size, dtype)
        forced = requested_path()
        if forced is None:
            return available[-1]
        if forced not in available:
            raise ConfigurationError(PATH_ENV_VAR, f"the {forced} path cannot run heads={num_heads}, "
                                                   f"kv_heads={num_kv_heads}, head_dim={head_dim}, "
                                                   f"block_size={block_size}, dtype={dtype} here (available: "
                                                   f"{', '.join(available)})")
        return forced

    def __call__(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                 query_lens: torch.Tensor | None = None, path: str | None = None) -> torch.Tensor:
        """query (num_rows, num_heads, head_dim); caches (num_blocks, block_size, num_kv_heads,
        head_dim), contiguous; per segment, contiguous int32: block_tables (num_segments,
        max_blocks), context_lens (num_segments,) the context of the segment's last row, and
        query_lens (num_segments,) its row count (None: one row each, plain decode). Row i of a
        segment of n rows sees context_len - n + 1 + i positions. Returns (num_rows, num_heads,
        head_dim) in the query's dtype."""
        if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
            raise ValueError("key_cache/value_cache: the native decode kernel needs contiguous caches")
        num_segments = block_tables.shape[0]
        num_rows = num_segments if query_lens is None else int(query_lens.sum())
        if query.shape[0] != num_rows:
            raise ValueError(f"query_lens: {num_rows} rows in the segments, {query.shape[0]} query rows")
        query = query.contiguous()
        output = torch.empty_like(query)
        _, num_heads, head_dim = query.shape
        _, block_size, num_kv_heads, _ = key_cache.shape
        path = path or self.path(num_heads, num_kv_heads, head_dim, block_size, query.dtype)
        if path not in self.available_paths(num_heads, num_kv_heads, head_dim, block_size, query.dtype):
            raise ValueError(f"path: {path} cannot run heads={num_heads}, kv_heads={num_kv_heads}, "
                             f"head_dim={head_dim}, block_size={block_size}, dtype={query.dtype} here")
        self._functions[query.dtype](
            query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), block_tables.data_ptr(),
            context_lens.data_ptr(), None if query_lens is None else query_lens.data_ptr(), output.data_ptr(),
            num_segments, num_heads, num_kv_heads, head_dim, block_size, block_tables.shape[1], scale,
            PATH_NAMES.index(path), torch.get_num_threads())
        return output


@functools.cache
def load_native_decode() -> NativePagedDecode | None:
    """The kernel, built on first use; None when disabled (PDSERVE_NATIVE_KERNELS=0) or unbuildable."""
    return load_library(SOURCE, NativePagedDecode, "decode attention falls back to torch")
