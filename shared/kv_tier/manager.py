"""The tiers below an engine's block pool: where evicted blocks go and prefix hits come from.

Levels, top first: the host tier (an arena in shared memory, shared by the instances of one
host) and the file tier (an arena in a memory-mapped file on local disk); either may be off.
On the engine thread:

- `on_evicted`: blocks the pool is about to reuse are copied into the top level first (a block
  already there is only marked used). A block pushed out of the host tier moves down to the
  file tier.
- `on_freed` (write-through): a request's computed blocks are stored when its blocks are
  freed, so a decode instance's finished conversation is in the host tier for the next turn.
- `load` (the KV cache manager's lower tier): after the pool's own prefix hits, the leading
  run of further blocks the levels hold is loaded into freshly allocated pool blocks, when
  the cost model says loading is cheaper than computing them again; the blocks join the prefix
  cache and count as ordinary hits. A block that fails its checksum, or that another process
  evicted meanwhile, ends the run: the rest is computed.

The events (`drain_events`) keep the host's entry in the prefix index true for routing.
"""

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from shared.cache_dir import pdserve_cache_dir
from shared.core.request import Request
from shared.errors import ConfigurationError
from shared.kv_cache.block_pool import BlockPool, EvictedBlock, KVBlock
from shared.kv_cache.layout import KVCacheLayout
from shared.kv_events.wire import MEDIUM_BY_TIER
from shared.kv_tier.arena import ArenaGeometry, KVArena
from shared.kv_tier.block_copy import copy_block_to_slot, copy_slot_to_block
from shared.kv_tier.config import DEFAULT_COMPUTE_SECONDS_PER_TOKEN, DEFAULT_LOAD_SECONDS_PER_BLOCK, KVTierConfig
from shared.kv_tier.cost import CostModel
from shared.kv_tier.identity import arena_path, tier_id
from shared.kv_tier.patient_lock import ArenaBusy
from shared.kv_tier.stats import KVTierStats, TierCounters

logger = logging.getLogger(__name__)

MAX_PENDING_EVENTS = 100_000


@dataclass
class TierEvents:
    """Blocks this host's tiers gained and lost through this instance since the last drain."""
    stored: list[bytes] = field(default_factory=list)
    removed: list[bytes] = field(default_factory=list)
    overflowed: bool = False


@dataclass
class _Level:
    name: str
    arena: KVArena
    counters: TierCounters


class KVTierManager:
    def __init__(self, config: KVTierConfig, kv_access, pool: BlockPool, fingerprint: bytes):
        self.config = config
        self.kv_access = kv_access  # shared.kv_transfer.base.KVCacheAccess: the executor
        self.pool = pool
        layout: KVCacheLayout = kv_access.kv_cache_layout
        self.block_size = layout.block_size
        self.block_bytes = layout.bytes_per_block
        self.levels = self._open_levels(config, fingerprint, layout)
        self.tier_id = tier_id(config.host_dir if config.host_bytes > 0 else self._file_dir(config), fingerprint)
        self.cost = CostModel(
            {"host": config.host_load_seconds_per_block or DEFAULT_LOAD_SECONDS_PER_BLOCK["host"],
             "file": config.file_load_seconds_per_block or DEFAULT_LOAD_SECONDS_PER_BLOCK["file"]},
            config.compute_seconds_per_token or DEFAULT_COMPUTE_SECONDS_PER_TOKEN)
        self._events = TierEvents()

    def _open_levels(self, config: KVTierConfig, fingerprint: bytes, layout: KVCacheLayout) -> list[_Level]:
        levels = []
        for name, num_bytes, directory in (("host", config.host_bytes, config.host_dir),
                                           ("file", config.file_bytes, self._file_dir(config))):
            num_slots = num_bytes // layout.bytes_per_block
            if num_slots < 1:
                continue
            geometry = ArenaGeometry(layout.bytes_per_block, num_slots, layout.block_size)
            try:
                Path(directory).mkdir(parents=True, exist_ok=True)
                arena = KVArena(arena_path(directory, fingerprint, name), fingerprint, geometry)
            except OSError as error:
                for level in levels:
                    level.arena.close()
                raise ConfigurationError(f"kv_{name}_tier_gb", f"cannot keep {num_bytes / 2**30:.2f} GiB of KV "
                                                               f"blocks in {directory}: {error}") from error
            levels.append(_Level(name, arena, TierCounters(name)))
        return levels

    @staticmethod
    def _file_dir(config: KVTierConfig) -> str:
        return config.file_dir or str(pdserve_cache_dir() / "kv-tier")

    def close(self) -> None:
        for level in self.levels:
            level.arena.close()

    # ---- stores ----------------------------------------------------------------------------

    def on_evicted(self, evicted: list[EvictedBlock]) -> None:
        """The pool is about to reuse these blocks (their KV still intact): keep them below."""
        self._store([(block.block_id, block.block_hash, block.token_ids) for block in evicted])

    def on_freed(self, blocks: list[KVBlock]) -> None:
        """A request let go of its blocks (write-through): keep its computed blocks below."""
        if self.config.write_through:
            self._store([(block.block_id, block.block_hash, block.token_ids) for block in blocks
                         if block.block_hash is not None])

    def _store(self, blocks: list[tuple[int, bytes, tuple[int, ...]]]) -> None:
        if not blocks or not self.levels:
            return
        top = self.levels[0]
        source, layout, source_ids = self.kv_access.blocks_for_send([block_id for block_id, _, _ in blocks])

        def copy_in(index: int, slot) -> None:
            copy_block_to_slot(source, layout, source_ids[index], slot)

        try:
            result = top.arena.put([h for _, h, _ in blocks], [t for _, _, t in blocks], copy_in,
                                   on_evict=self._demote if len(self.levels) > 1 else None)
        except ArenaBusy:  # a cache: the blocks are simply not kept (the arena counts it)
            return
        top.counters.num_stores += len(result.stored)
        top.counters.num_evictions += len(result.evicted)
        self._record(self._events.stored, result.stored)
        if len(self.levels) == 1:
            self._record(self._events.removed, result.evicted)
        self._log_stored(top, result.stored, {block_hash: tokens for _, block_hash, tokens in blocks})
        self._log_removed(top, result.evicted)

    def _demote(self, block_hash: bytes, token_ids: tuple[int, ...], data, crc: int) -> None:
        """A block the host tier pushes out moves down to the file tier (same bytes, same CRC)."""
        lower = self.levels[1]

        def copy_in(index: int, slot) -> None:
            slot[:] = data

        try:
            result = lower.arena.put([block_hash], [token_ids], copy_in, crcs=[crc])
        except ArenaBusy:  # the block leaves the host tier without a copy below
            return
        lower.counters.num_stores += len(result.stored)
        lower.counters.num_evictions += len(result.evicted)
        self._record(self._events.removed, result.evicted)
        self._log_stored(lower, result.stored, {block_hash: token_ids})
        self._log_removed(lower, result.evicted)

    # ---- loads -----------------------------------------------------------------------------

    def load(self, request: Request, hits: list[KVBlock], max_blocks: int) -> list[KVBlock]:
        """Load the leading run of `request`'s blocks after `hits` that the tiers hold (up to
        `max_blocks` in all) into new pool blocks, now in the prefix cache; [] when none, when
        computing them is cheaper, or when the pool has no room."""
        start = len(hits)
        hashes, tokens = self._missing_run(request, start, max_blocks)
        runs = self._find_runs(hashes, tokens)
        num_found = sum(count for _, _, count in runs)
        if num_found == 0 or not self._decide(request, runs):
            return []
        num_room = self.pool.num_free_blocks - sum(1 for block in hits if block.ref_count == 0)
        num_load = min(num_found, num_room)
        if num_load <= 0:
            return []
        return self._load_into_pool(hashes[:num_load], tokens[:num_load], runs, hits)

    def _missing_run(self, request: Request, start: int, end: int) -> tuple[list[bytes], list[tuple[int, ...]]]:
        """Hashes and token ids of blocks start.. up to `end` or the next block the pool holds."""
        hashes, tokens = [], []
        for index in range(start, end):
            block_tokens = tuple(request.all_token_ids[index * self.block_size:(index + 1) * self.block_size])
            block_hash = request.block_hashes[index]
            if self.pool.lookup(block_hash, block_tokens) is not None:
                break
            hashes.append(block_hash)
            tokens.append(block_tokens)
        return hashes, tokens

    def _find_runs(self, hashes: list[bytes], tokens: list[tuple[int, ...]]) -> list[tuple[_Level, int, int]]:
        """(level, first index, count) runs covering the leading blocks some level holds."""
        runs, position, looked_up = [], 0, set()
        while position < len(hashes):
            progress = False
            for level in self.levels:
                try:
                    count = level.arena.count_run(hashes[position:], tokens[position:])
                except ArenaBusy:  # looked up as a miss
                    continue
                level.counters.num_hits += count
                if (level.name, position) not in looked_up:
                    looked_up.add((level.name, position))
                    level.counters.num_misses += count == 0
                if count:
                    runs.append((level, position, count))
                    position += count
                    progress = True
                    break
            if not progress:
                break
        return runs

    def _decide(self, request: Request, runs: list[tuple[_Level, int, int]]) -> bool:
        by_tier: dict[str, int] = {}
        for level, _, count in runs:
            by_tier[level.name] = by_tier.get(level.name, 0) + count
        decision = self.cost.decide(by_tier, self.block_size)
        counters = runs[0][0].counters
        if decision.load:
            counters.num_load_decisions += 1
        else:
            counters.num_recompute_decisions += 1
        logger.debug("request %s: %s %s blocks (load %.2f ms, recompute %.2f ms)", request.request_id,
                     "loading" if decision.load else "recomputing", by_tier, decision.load_seconds * 1e3,
                     decision.recompute_seconds * 1e3)
        return decision.load

    def _load_into_pool(self, hashes: list[bytes], tokens: list[tuple[int, ...]],
                        runs: list[tuple[_Level, int, int]], hits: list[KVBlock]) -> list[KVBlock]:
        self.pool.touch(hits)  # so that allocating cannot evict them
        blocks: list[KVBlock] = []
        try:
            blocks = self.pool.allocate(len(hashes))
            block_ids = [block.block_id for block in blocks]
            num_loaded = self._copy_runs(hashes, tokens, runs, block_ids)
            for block, block_hash, block_tokens in zip(blocks[:num_loaded], hashes, tokens):
                self.pool.cache(block, block_hash, block_tokens)
            if num_loaded:
                self.kv_access.commit_received_blocks(block_ids[:num_loaded])
        finally:
            # Tail first (it is evicted first): unloaded blocks, loaded ones, then the hits.
            self.pool.free(list(reversed(hits + blocks)))
        return blocks[:num_loaded]  # cached and free: the caller takes them as hits

    def _copy_runs(self, hashes, tokens, runs, block_ids: list[int]) -> int:
        """Copy each run's blocks into `block_ids`; the number copied (stops at the first failure)."""
        kv_cache, layout = self.kv_access.kv_cache, self.kv_access.kv_cache_layout
        for level, first, count in runs:
            count = min(count, len(hashes) - first)
            if count <= 0:
                break

            def copy_out(index: int, slot, first=first) -> None:
                copy_slot_to_block(slot, kv_cache, layout, block_ids[first + index])

            started = time.perf_counter()
            try:
                num_copied, num_corrupt = level.arena.load_run(hashes[first:first + count],
                                                               tokens[first:first + count], copy_out)
            except ArenaBusy:  # the rest is computed
                return first
            self._record_load(level, num_copied, num_corrupt, time.perf_counter() - started)
            if num_corrupt:
                self._record(self._events.removed, [hashes[first + num_copied]])
                self._log_removed(level, [hashes[first + num_copied]])
            if num_copied < count:
                return first + num_copied
        return min(len(hashes), sum(count for _, _, count in runs))

    def _record_load(self, level: _Level, num_copied: int, num_corrupt: int, seconds: float) -> None:
        counters = level.counters
        counters.num_loads += num_copied
        counters.num_corrupt += num_corrupt
        counters.load_seconds += seconds
        counters.recompute_avoided_tokens += num_copied * self.block_size
        self.cost.record_load(level.name, num_copied, seconds)

    def record_compute(self, num_tokens: int, seconds: float) -> None:
        """An engine step computed `num_tokens` prompt tokens in `seconds` (the cost model's input)."""
        self.cost.record_compute(num_tokens, seconds)

    # ---- events and stats ------------------------------------------------------------------

    def _record(self, events: list[bytes], block_hashes) -> None:
        if self._events.overflowed or not block_hashes:
            return
        if len(self._events.stored) + len(self._events.removed) + len(block_hashes) > MAX_PENDING_EVENTS:
            self._events = TierEvents(overflowed=True)
            return
        events.extend(block_hashes)

    def _log_stored(self, level: _Level, block_hashes, tokens_of: dict[bytes, tuple[int, ...]]) -> None:
        """KV events (when the engine publishes them): one BlockStored per block, without a
        parent (a tier holds blocks, not chains)."""
        log = self.pool.kv_event_log
        if log is not None:
            for block_hash in block_hashes:
                log.stored([block_hash], None, tokens_of[block_hash], self.block_size, MEDIUM_BY_TIER[level.name])

    def _log_removed(self, level: _Level, block_hashes) -> None:
        if self.pool.kv_event_log is not None and block_hashes:
            self.pool.kv_event_log.removed(block_hashes, MEDIUM_BY_TIER[level.name])

    def drain_events(self) -> TierEvents:
        events, self._events = self._events, TierEvents()
        return events

    def resend_all_events(self) -> None:
        """Events drained but not delivered (a level was busy): the next drain asks for a snapshot."""
        self._events = TierEvents(overflowed=True)

    def held_hashes(self) -> list[bytes]:
        """Every block some level of this host holds (a snapshot for the prefix index);
        ArenaBusy when a level's lock stays held."""
        found: dict[bytes, None] = {}
        for level in self.levels:
            found.update(dict.fromkeys(level.arena.hashes()))
        return list(found)

    def stats(self) -> tuple[KVTierStats, ...]:
        return tuple(level.counters.frozen(level.arena.num_valid, level.arena.geometry.num_slots, self.block_bytes,
                                           level.arena.num_lock_timeouts)
                     for level in self.levels)
