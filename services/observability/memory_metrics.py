"""An instance's memory gauges (shared.memory): weights and KV pool from the engine's info,
the KV connector's staging buffers and the engine's bounded caches from its latest status,
read at scrape time."""

from shared.memory.cache_usage import CacheUsage
from shared.memory.components import memory_by_component
from shared.metrics.memory_collector import MemoryCollector
from shared.model.cpu_runtime import onednn_cache_capacity


class InstanceMemory:
    def __init__(self, runtime):
        self.runtime = runtime  # services.instance.runtime.InstanceRuntime
        info = runtime.engine.info
        self.weights = info.weight_bytes
        self.kv_pool = info.kv_pool_bytes

    def collector(self, labels: dict[str, str]) -> MemoryCollector:
        return MemoryCollector(labels, self.components, self.caches)

    def caches(self) -> list[CacheUsage]:
        status = self.runtime.engine.latest_status()
        staging = status.kv_transfer.staging
        usage = [CacheUsage("kv_staging", staging.num_free_buffers, -1, staging.memory_bytes, staging.max_free_bytes),
                 CacheUsage("onednn_primitives", -1, onednn_cache_capacity(), -1)]
        return usage + [CacheUsage(name, entries, limit, size)
                        for name, (entries, limit, size) in status.memory.caches.items()]

    def components(self) -> dict[str, int]:
        caches = self.caches()
        staging = next(c.memory_bytes for c in caches if c.name == "kv_staging")
        other_caches = sum(max(0, c.memory_bytes) for c in caches if c.name != "kv_staging")
        return memory_by_component(self.weights, self.kv_pool, staging, other_caches)
