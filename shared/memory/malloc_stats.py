"""glibc malloc introspection and trimming through ctypes (no-ops where libc is not glibc).

`malloc_stats()` reads mallinfo2(3) (all arenas together) and counts the arenas in
malloc_info(3); `malloc_free_bytes()` reads mallinfo2's free bytes alone (cheap enough to call
every few seconds); `release_free_memory()` is malloc_trim(0), which hands every whole free
page in every arena back to the kernel (MADV_DONTNEED), however fragmented the arena is. Pages
returned from inside a heap still count as free in mallinfo2 (free, just no longer resident).
"""

import ctypes
import ctypes.util
import functools
import platform
import re
from dataclasses import dataclass


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


@dataclass(frozen=True)
class MallocStats:
    heap_bytes: int  # obtained from the kernel with brk/arena heaps (mallinfo2.arena)
    mmap_bytes: int  # in chunks mmapped one by one (hblkhd)
    in_use_bytes: int  # handed out and not freed (uordblks)
    free_bytes: int  # free inside the heaps: reusable, resident until trimmed (fordblks)
    num_arenas: int


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    libc.open_memstream.restype = ctypes.c_void_p
    libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


def is_glibc() -> bool:
    return _glibc() is not None


def malloc_stats() -> MallocStats | None:
    """The allocator's totals now, or None without glibc."""
    libc = _glibc()
    if libc is None:
        return None
    info = libc.mallinfo2()
    return MallocStats(info.arena, info.hblkhd, info.uordblks + info.hblkhd, info.fordblks, count_arenas(libc))


def malloc_free_bytes() -> int | None:
    """Bytes free inside glibc's heaps (mallinfo2's fordblks) without counting arenas: the cheap
    reading for a check made often. None without glibc."""
    libc = _glibc()
    return None if libc is None else libc.mallinfo2().fordblks


def count_arenas(libc: ctypes.CDLL) -> int:
    """Arenas listed by malloc_info(3)'s XML (one `<heap nr=...>` each)."""
    buffer, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(buffer), ctypes.byref(size))
    if not stream:
        return 0
    try:
        libc.malloc_info(0, stream)
    finally:
        libc.fclose(stream)
    text = ctypes.string_at(buffer, size.value).decode(errors="replace")
    libc.free(ctypes.cast(buffer, ctypes.c_void_p))
    return len(re.findall(r"<heap nr=", text))


def release_free_memory() -> bool:
    """malloc_trim(0): return free pages of every arena to the kernel; True if any were."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
