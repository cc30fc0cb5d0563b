"""The pool of KV cache blocks: reference counts, an LRU free queue, the prefix-cache map.

A block with ref_count 0 sits in the free queue; if it still holds a cached prefix it can be
revived by a prefix hit until allocation reuses (evicts) it. Allocation takes from the front
of the queue (least recently freed), frees go to the back.

`on_evict`, when set, sees every cached block that allocation is about to reuse, once per
allocation and before the caller writes into it (its KV still intact): the KV tiers below the
pool copy it there (shared.kv_tier).

Every store into and eviction from the prefix cache is recorded as an event for whoever
mirrors the cache (the prefix publisher, through the engine API). Nobody may drain them (an
offline engine): past `max_pending_events` they are dropped and `events_overflowed` says the
next reader needs a snapshot of every cached hash instead.

`kv_event_log`, when set (an engine publishing KV events, shared.kv_events), also hears of
every removal (BlockRemoved) and of a reset (AllBlocksCleared); the KV cache manager records
the stores, since it knows each block's parent and extra keys.
"""

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.kv_cache.block_hash import BlockHash
from shared.kv_events.log import KVEventLog
from shared.kv_events.wire import MEDIUM_POOL


@dataclass
class KVBlock:
    block_id: int
    ref_count: int = 0
    # Set while the block is registered in the prefix cache.
    block_hash: BlockHash | None = None
    # The block's token ids, compared on every hit so a hash collision can never hand
    # one prompt another prompt's KV.
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class EvictedBlock:
    """A cached block allocation is reusing: its KV is still in the cache until the caller writes."""
    block_id: int
    block_hash: BlockHash
    token_ids: tuple[int, ...]


@dataclass
class PrefixCacheEvents:
    """Block hashes stored into and evicted from the prefix cache since the last drain."""

    stored: list[BlockHash] = field(default_factory=list)
    evicted: list[BlockHash] = field(default_factory=list)


DEFAULT_MAX_PENDING_EVENTS = 100_000


class BlockPool:
    def __init__(self, num_blocks: int, max_pending_events: int = DEFAULT_MAX_PENDING_EVENTS):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.max_pending_events = max_pending_events
        self.events_overflowed = False
        self.blocks = [KVBlock(block_id) for block_id in range(num_blocks)]
        self._free_queue: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[BlockHash, KVBlock] = {}
        self._events = PrefixCacheEvents()
        self.on_evict: Callable[[list[EvictedBlock]], None] | None = None
        self.kv_event_log: KVEventLog | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_queue)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def free_block_ids(self) -> list[int]:
        """Free block ids in allocation order (the next allocation takes the first)."""
        return list(self._free_queue)

    def allocate(self, num_blocks: int) -> list[KVBlock]:
        if num_blocks > self.num_free_blocks:
            raise RuntimeError(f"asked for {num_blocks} blocks, {self.num_free_blocks} free")
        allocated, evicted = [], []
        for _ in range(num_blocks):
            _, block = self._free_queue.popitem(last=False)
            if block.block_hash is not None and self.on_evict is not None:
                evicted.append(EvictedBlock(block.block_id, block.block_hash, block.token_ids))
            self._evict(block)
            block.ref_count = 1
            allocated.append(block)
        if evicted:
            self.on_evict(evicted)
        return allocated

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on blocks found by a prefix hit (reviving free ones)."""
        for block in blocks:
            if block.ref_count == 0:
                del self._free_queue[block.block_id]
            block.ref_count += 1

    def free(self, blocks: list[KVBlock]) -> None:
        """Drop a reference; blocks reaching zero join the back of the free queue in the
        order given (callers pass a sequence's tail first, so its prefix is evicted last)."""
        for block in blocks:
            if block.ref_count <= 0:
                raise RuntimeError(f"block {block.block_id} freed more often than taken")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free_queue[block.block_id] = block

    def lookup(self, block_hash: BlockHash, token_ids: tuple[int, ...]) -> KVBlock | None:
        block = self._cached.get(block_hash)
        if block is None or block.token_ids != token_ids:
            return None
        return block

    def cache(self, block: KVBlock, block_hash: BlockHash, token_ids: tuple[int, ...]) -> bool:
        """Register a full, computed block under its hash (first writer wins); False when the
        block or the hash was registered already."""
        if block.block_hash is not None or block_hash in self._cached:
            return False
        block.block_hash = block_hash
        block.token_ids = token_ids
        self._cached[block_hash] = block
        self._record(self._events.stored, block_hash)
        return True

    def drain_events(self) -> PrefixCacheEvents:
        """The events since the last drain; clears `events_overflowed` (the caller that saw it
        set takes a snapshot with `cached_hashes`)."""
        events, self._events = self._events, PrefixCacheEvents()
        self.events_overflowed = False
        return events

    def _record(self, events: list[BlockHash], block_hash: BlockHash) -> None:
        if self.events_overflowed:
            return
        if len(self._events.stored) + len(self._events.evicted) >= self.max_pending_events:
            self._events = PrefixCacheEvents()
            self.events_overflowed = True
            return
        events.append(block_hash)

    def cached_hashes(self) -> list[BlockHash]:
        return list(self._cached)

    def reset_prefix_cache(self) -> None:
        for block in list(self._cached.values()):
            self._evict(block)
        if self.kv_event_log is not None:
            self.kv_event_log.cleared()

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is None:
            return
        del self._cached[block.block_hash]
        self._record(self._events.evicted, block.block_hash)
        if self.kv_event_log is not None:
            self.kv_event_log.removed([block.block_hash], MEDIUM_POOL)
        block.block_hash = None
        block.token_ids = None
