"""An instance's memory gauges (shared.memory): weights and KV pool measured once, the KV
staging pools of its handlers and its bounded caches read at scrape time."""

from shared.memory.cache_usage import CacheUsage
from shared.memory.components import memory_by_component
from shared.memory.engine_memory import grammar_cache_usage, kv_pool_bytes, weight_bytes
from shared.metrics.memory_collector import MemoryCollector
from shared.model.cpu_runtime import onednn_cache_capacity


class InstanceMemory:
    def __init__(self, runtime):
        self.runtime = runtime  # services.common.runtime.InstanceRuntime
        executor = runtime.engine.executor
        self.weights = weight_bytes(executor)
        self.kv_pool = kv_pool_bytes(executor)

    def collector(self, labels: dict[str, str]) -> MemoryCollector:
        return MemoryCollector(labels, self.components, self.caches)

    def staging_pools(self) -> list:
        handlers = self.runtime.handlers
        if handlers is None:
            return []
        found = [getattr(getattr(handlers, "prefill", None), "sender", None),
                 getattr(getattr(handlers, "decode", None), "receiver", None)]
        return [end.staging for end in found if end is not None]

    def caches(self) -> list[CacheUsage]:
        pools = self.staging_pools()
        usage = [CacheUsage("kv_staging", sum(p.num_free_buffers for p in pools), -1,
                            sum(p.memory_bytes for p in pools), sum(p.max_free_bytes for p in pools)),
                 CacheUsage("onednn_primitives", -1, onednn_cache_capacity(), -1)]
        scheduler = self.runtime.engine.scheduler
        usage.append(CacheUsage("request_state", len(scheduler.requests) + len(scheduler.held), -1, -1))
        grammars = grammar_cache_usage(self.runtime.engine)
        return usage + ([grammars] if grammars is not None else [])

    def components(self) -> dict[str, int]:
        caches = self.caches()
        staging = next(c.memory_bytes for c in caches if c.name == "kv_staging")
        other_caches = sum(max(0, c.memory_bytes) for c in caches if c.name != "kv_staging")
        return memory_by_component(self.weights, self.kv_pool, staging, other_caches)
