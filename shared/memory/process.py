"""The process's resident memory, read from /proc (0 where there is none)."""

import os

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int | str = "self") -> int:
    """Resident set size of `pid` (VmRSS), or 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0
