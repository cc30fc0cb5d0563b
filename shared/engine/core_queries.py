"""Reads of an engine core's state as plain data (shared.engine.client types), taken between
steps on the thread (or in the process) that steps the core."""

from shared.engine.client import (CacheSettings, EngineInfo, EngineLoad, EngineMemory, EngineStatus,
                                  KVCacheEvents)
from shared.engine.engine_core import EngineCore
from shared.memory.engine_memory import grammar_cache_usage, kv_pool_bytes, weight_bytes


def engine_info(core: EngineCore) -> EngineInfo:
    layout = core.executor.kv_cache_layout
    kv_layout = f"kv,layer,block,{layout.block_size},{layout.num_kv_heads},{layout.head_dim}x{layout.num_layers}"
    cache = CacheSettings(model_id=core.kv_manager.model_key, block_size=layout.block_size,
                          prefix_hash_algo=core.config.cache.prefix_hash_algo, dtype=str(layout.dtype).removeprefix("torch."),
                          kv_layout=kv_layout, tensor_parallel_size=core.config.parallel.tensor_parallel_size)
    return EngineInfo(cache=cache, num_blocks=layout.num_blocks, vocab_size=core.model_config.vocab_size,
                      max_model_len=core.max_model_len, weight_bytes=weight_bytes(core.executor),
                      kv_pool_bytes=kv_pool_bytes(core.executor))


def engine_load(core: EngineCore) -> EngineLoad:
    scheduler, pool = core.scheduler, core.block_pool
    return EngineLoad(len(scheduler.waiting), len(scheduler.running), len(scheduler.reserved),
                      pool.num_free_blocks, pool.num_blocks)


def engine_status(core: EngineCore) -> EngineStatus:
    stats = core.stats
    return EngineStatus(load=engine_load(core), num_held=len(core.scheduler.held),
                        num_prompt_tokens_computed=stats.num_prompt_tokens_computed,
                        num_cached_prompt_tokens=stats.num_cached_prompt_tokens,
                        num_generation_tokens=stats.num_generation_tokens,
                        num_requests_finished=stats.num_requests_finished)


def kv_cache_events(core: EngineCore, snapshot: bool = False) -> KVCacheEvents:
    """Stored/removed prefix hashes since the last drain (a hash in both ends as the pool has
    it now); with `snapshot`, every cached hash instead (pending events are dropped)."""
    pool = core.block_pool
    events = pool.drain_events()
    if snapshot:
        return KVCacheEvents(stored=tuple(pool.cached_hashes()), is_snapshot=True)
    stored, removed = set(events.stored), set(events.evicted)
    both = stored & removed
    if both:
        cached = set(pool.cached_hashes())
        stored -= both - cached
        removed -= both & cached
    return KVCacheEvents(stored=tuple(sorted(stored)), removed=tuple(sorted(removed)))


def engine_memory(core: EngineCore) -> EngineMemory:
    """Bounded caches and per-request state: name -> (entries, limit, bytes); -1 unknown."""
    scheduler = core.scheduler
    caches = {"request_state": (len(scheduler.requests) + len(scheduler.held), -1, -1)}
    grammars = grammar_cache_usage(core)
    if grammars is not None:
        caches[grammars.name] = (grammars.num_entries, grammars.max_entries, grammars.memory_bytes)
    return EngineMemory(caches)
