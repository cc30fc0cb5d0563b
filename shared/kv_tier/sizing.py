"""Default tier sizes that fit the machine."""

import logging
import os

logger = logging.getLogger(__name__)

GIB = 1 << 30
# The host tier takes at most this share of the machine's memory, and at most this share of
# what its directory (a memory file system) has free: the pools, models and the OS keep the rest.
HOST_TIER_MEMORY_SHARE = 1 / 8
HOST_TIER_DIR_SHARE = 1 / 2


def machine_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def free_bytes(directory: str) -> int:
    """Free space of the file system holding `directory` (0 when it does not exist)."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize


def default_host_tier_bytes(directory: str) -> int:
    """An eighth of the machine's memory, at most half of what `directory` has free."""
    size = int(min(machine_memory_bytes() * HOST_TIER_MEMORY_SHARE, free_bytes(directory) * HOST_TIER_DIR_SHARE))
    logger.info("KV host tier sized to the machine: %.2f GiB in %s", size / GIB, directory)
    return size
