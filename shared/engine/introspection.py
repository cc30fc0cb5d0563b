"""What the engine API reports about an EngineCore (the in-thread client's and the core
process's alike): its fixed info, its status (load, counters, KV transfer, memory) and its
prefix-cache events. Called on the engine's thread for a
consistent snapshot, or from another thread for a latest-values read (plain ints and lengths:
each value some recent one, never a torn one)."""

from shared.engine.engine_core import EngineCore
from shared.engine_api.client import (
    CacheSettings, EngineInfo, EngineLoad, EngineMemory, EngineStatus, KVCacheEvents, SpecDecodeCounts,
)
from shared.kv_cache.block_pool import BlockPool
from shared.kv_tier.manager import KVTierManager
from shared.kv_tier.patient_lock import ArenaBusy
from shared.kv_transfer.types import KVConnectorStats
from shared.memory.engine_memory import grammar_cache_usage, kv_pool_bytes, weight_bytes


def engine_info(core: EngineCore) -> EngineInfo:
    layout = core.executor.kv_cache_layout
    cache = CacheSettings(
        model_id=core.kv_manager.model_key, block_size=layout.block_size,
        prefix_hash_algo=core.kv_manager.hash_algo, dtype=str(layout.dtype).removeprefix("torch."),
        kv_layout=layout.description,
        tensor_parallel_size=core.config.parallel.tensor_parallel_size)
    address = core.connector.address if core.connector is not None else ""
    tiers = core.tiers.manager
    return EngineInfo(cache, layout.num_blocks, core.model_config.vocab_size, core.max_model_len,
                      weight_bytes(core.executor), kv_pool_bytes(core.executor), address,
                      kv_tier_id=tiers.tier_id if tiers is not None else "", compute=core.executor.compute_paths)


def engine_load(core: EngineCore) -> EngineLoad:
    scheduler, pool = core.scheduler, core.block_pool
    resident = core.adapters.names_of(core.executor.resident_lora_ids())
    num_prefilling = sum(1 for request in scheduler.running
                         if request.num_output_tokens <= request.num_resumed_output_tokens)
    return EngineLoad(len(scheduler.waiting), len(scheduler.running), len(scheduler.waiting_for_remote_kv),
                      pool.num_free_blocks, pool.num_blocks, tuple(sorted(resident)), num_prefilling,
                      _adapter_names(scheduler.running), _adapter_names(scheduler.waiting))


def _adapter_names(requests) -> tuple[str, ...]:
    return tuple(sorted({request.lora_request.lora_name for request in requests if request.lora_request}))


def engine_status(core: EngineCore) -> EngineStatus:
    stats, spec = core.stats, core.spec_stats
    return EngineStatus(
        load=engine_load(core), num_held=len(core.scheduler.sending),
        num_prompt_tokens=stats.num_prompt_tokens, num_prompt_tokens_computed=stats.num_prompt_tokens_computed,
        num_cached_prompt_tokens=stats.num_cached_prompt_tokens, num_generation_tokens=stats.num_generation_tokens,
        num_requests_finished=stats.num_requests_finished, num_prefix_cache_queries=stats.num_prefix_cache_queries,
        num_prefix_cache_hits=stats.num_prefix_cache_hits, num_preemptions=stats.num_preemptions,
        num_steps=stats.num_steps,
        spec_decode=SpecDecodeCounts(spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens,
                                     tuple(spec.accepted_per_position)),
        kv_transfer=core.connector.stats() if core.connector is not None else KVConnectorStats(),
        memory=engine_memory(core),
        kv_tiers=core.tiers.manager.stats() if core.tiers.manager is not None else (),
        num_kv_events_dropped=core.kv_events.num_dropped if core.kv_events is not None else 0)


def engine_memory(core: EngineCore) -> EngineMemory:
    scheduler = core.scheduler
    caches = {"request_state": (len(scheduler.requests) + len(scheduler.sending), -1, -1)}
    grammars = grammar_cache_usage(core)
    if grammars is not None:
        caches[grammars.name] = (grammars.num_entries, grammars.max_entries, grammars.memory_bytes)
    return EngineMemory(caches)


def kv_cache_events(pool: BlockPool, snapshot: bool = False, tiers: KVTierManager | None = None) -> KVCacheEvents:
    """The prefix-cache changes since the last call, netted (a hash stored and evicted ends as
    the pool has it now); every cached hash instead when asked or when events were dropped.
    The same for the host's KV tiers (`tiers`), as far as this instance changed them."""
    tier_fields = _tier_events(tiers, snapshot) if tiers is not None else {}
    if snapshot or pool.events_overflowed:
        pool.drain_events()
        return KVCacheEvents(stored=tuple(pool.cached_hashes()), is_snapshot=True, **tier_fields)
    events = pool.drain_events()
    stored, removed = _netted(events.stored, events.evicted, pool.cached_hashes)
    return KVCacheEvents(stored=stored, removed=removed, **tier_fields)


def _tier_events(tiers: KVTierManager, snapshot: bool) -> dict:
    """No tier events this time when a tier's lock stays held (a stopped process of the host
    holds it); the next call sends a snapshot instead."""
    events = tiers.drain_events()
    try:
        if snapshot or events.overflowed:
            return {"tier_stored": tuple(tiers.held_hashes()), "is_tier_snapshot": True}
        stored, removed = _netted(events.stored, events.removed, tiers.held_hashes)
    except ArenaBusy:
        tiers.resend_all_events()
        return {}
    return {"tier_stored": stored, "tier_removed": removed}


def _netted(stored_events, removed_events, held) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """(stored, removed), each hash in at most one: where it is in both, as `held()` has it now."""
    stored, removed = set(stored_events), set(removed_events)
    both = stored & removed
    if both:
        now = set(held())
        stored -= both - now
        removed -= both & now
    return tuple(sorted(stored)), tuple(sorted(removed))
