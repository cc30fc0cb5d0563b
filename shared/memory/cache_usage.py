"""One bounded cache's usage, as `pdserve:cache_*` reports it (shared.metrics.memory_collector)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class CacheUsage:
    """One bounded cache: entries and bytes held now, and its limits (-1: unknown or none)."""

    name: str
    num_entries: int
    max_entries: int
    memory_bytes: int
    max_bytes: int = -1
