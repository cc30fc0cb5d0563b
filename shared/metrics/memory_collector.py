"""Prometheus collector for an instance's memory: `pdserve:memory_bytes{component}` (see
shared.memory.components), glibc's arena count and the bounded caches' entries and limits.

The instance wires it with callables so this module needs no service imports:
`MemoryCollector(labels, read_components, read_caches)`.
"""

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.memory.cache_usage import CacheUsage
from shared.memory.malloc_stats import malloc_stats
from shared.metrics.families import FamilyMaker


class MemoryCollector(Collector):
    def __init__(self, labels: dict[str, str], read_components: Callable[[], dict[str, int]],
                 read_caches: Callable[[], list[CacheUsage]]):
        self.make = FamilyMaker(labels)
        self.read_components = read_components
        self.read_caches = read_caches

    def collect(self) -> Iterator:
        make = self.make
        yield make.labelled(GaugeMetricFamily, "pdserve:memory_bytes",
                            "Resident memory by component (weights, kv_pool, staging, caches, allocator_free, other).",
                            ("component",), (((name,), size) for name, size in self.read_components().items()))
        stats = malloc_stats()
        if stats is not None:
            yield make.gauge("pdserve:malloc_arenas", "glibc malloc arenas in this process.", stats.num_arenas)
        caches = self.read_caches()
        for suffix, attribute, documentation in (
                ("entries", "num_entries", "Entries in each bounded cache."),
                ("max_entries", "max_entries", "Configured entry limit of each bounded cache."),
                ("bytes", "memory_bytes", "Approximate bytes held by each bounded cache."),
                ("max_bytes", "max_bytes", "Configured byte limit of each bounded cache.")):
            rows = [((cache.name,), getattr(cache, attribute)) for cache in caches if getattr(cache, attribute) >= 0]
            yield make.labelled(GaugeMetricFamily, f"pdserve:cache_{suffix}", documentation, ("cache",), rows)
