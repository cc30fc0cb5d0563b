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
"""

import ctypes
import functools
import logging
from pathlib import Path

import torch

from shared.native.build import native_kernels_enabled, shared_library

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_decode.cpp"
_POINTER_ARGS = 7
_INT_ARGS = 6
_ENTRY_POINTS = {torch.bfloat16: "pdserve_paged_attention_bf16", torch.float32: "pdserve_paged_attention_f32"}
PATH_NAMES = ("portable", "avx512f", "avx512-bf16")


class NativePagedDecode:
    """Attention over a paged KV cache for query rows in segments: a segment is one
    sequence's consecutive rows (a decode row, or a prompt chunk's rows)."""

    def __init__(self, library: ctypes.CDLL):
        self._functions = {}
        for dtype, name in _ENTRY_POINTS.items():
            function = getattr(library, name)
            function.restype = None
            function.argtypes = [ctypes.c_void_p] * _POINTER_ARGS + [ctypes.c_int] * _INT_ARGS + [
                ctypes.c_float, ctypes.c_int]
            self._functions[dtype] = function
        self.max_head_dim = library.pdserve_paged_decode_max_head_dim()
        self.max_queries_per_kv = library.pdserve_paged_decode_max_queries_per_kv()
        self.max_block_size = library.pdserve_paged_decode_max_block_size()
        self._path = library.pdserve_paged_attention_path
        self._path.argtypes = [ctypes.c_int, ctypes.c_int]

    def supports(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                 dtype: torch.dtype) -> bool:
        return (dtype in self._functions and head_dim <= self.max_head_dim and block_size <= self.max_block_size
                and num_heads % num_kv_heads == 0 and num_heads // num_kv_heads <= self.max_queries_per_kv)

    def path(self, head_dim: int, dtype: torch.dtype) -> str:
        """The kernel path rows of this shape take on this build: portable, avx512f or avx512-bf16."""
        return PATH_NAMES[self._path(head_dim, int(dtype == torch.bfloat16))]

    def __call__(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                 query_lens: torch.Tensor | None = None) -> torch.Tensor:
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
        self._functions[query.dtype](
            query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), block_tables.data_ptr(),
            context_lens.data_ptr(), None if query_lens is None else query_lens.data_ptr(), output.data_ptr(),
            num_segments, num_heads, num_kv_heads, head_dim, block_size, block_tables.shape[1], scale,
            torch.get_num_threads())
        return output


@functools.cache
def load_native_decode() -> NativePagedDecode | None:
    """The kernel, built on first use; None when disabled (PDSERVE_NATIVE_KERNELS=0) or unbuildable."""
    if not native_kernels_enabled():
        return None
    library_path = shared_library(SOURCE)
    if library_path is None:
        return None
    try:
        return NativePagedDecode(ctypes.CDLL(str(library_path)))
    except (OSError, AttributeError) as error:
        logger.warning("Loading %s failed (%s); decode attention falls back to torch", library_path, error)
        return None
