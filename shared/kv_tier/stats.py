"""Counters of one KV tier as an engine sees it (plain data: they cross into the service
process inside the EngineStatus, and on to Prometheus, Redis and `pdserve status`)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class KVTierStats:
    tier: str                           # "host", "file" or "peer"
    num_blocks: int = 0                 # held now (a host tier: by every process of the host)
    capacity_blocks: int = 0
    block_bytes: int = 0
    # Since start, by this instance:
    num_hits: int = 0                   # blocks found here after the pool (and the tiers above) missed
    num_misses: int = 0                 # blocks looked up here and not found
    num_loads: int = 0                  # blocks copied from here into the pool
    num_stores: int = 0                 # blocks written here
    num_evictions: int = 0              # blocks this instance's stores pushed out
    num_corrupt: int = 0                # blocks that failed their checksum (dropped, recomputed)
    load_seconds: float = 0.0
    recompute_avoided_tokens: int = 0   # prompt tokens loaded instead of computed
    num_load_decisions: int = 0         # runs loaded because loading was measured cheaper
    num_recompute_decisions: int = 0    # runs computed again because that was measured cheaper
    num_busy_skips: int = 0             # arena operations given up: another process held the lock

    @property
    def num_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def capacity_bytes(self) -> int:
        return self.capacity_blocks * self.block_bytes


class TierCounters:
    """The mutable side of KVTierStats, kept by the engine thread (plain ints: a scrape from
    another thread reads some recent value)."""

    def __init__(self, tier: str):
        self.tier = tier
        self.num_hits = self.num_misses = self.num_loads = self.num_stores = 0
        self.num_evictions = self.num_corrupt = self.recompute_avoided_tokens = 0
        self.num_load_decisions = self.num_recompute_decisions = 0
        self.load_seconds = 0.0

    def frozen(self, num_blocks: int = 0, capacity_blocks: int = 0, block_bytes: int = 0,
               num_busy_skips: int = 0) -> KVTierStats:
        return KVTierStats(self.tier, num_blocks, capacity_blocks, block_bytes, self.num_hits, self.num_misses,
                           self.num_loads, self.num_stores, self.num_evictions, self.num_corrupt,
                           self.load_seconds, self.recompute_avoided_tokens, self.num_load_decisions,
                           self.num_recompute_decisions, num_busy_skips)
