"""The KV tiers' metric families, one sample per tier (host, file, peer)."""

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from shared.kv_tier.stats import KVTierStats
from shared.metrics.families import FamilyMaker

_GAUGES = (
    ("pdserve:kv_tier_blocks", "KV blocks the tier holds (a host tier: every instance of the host).", "num_blocks"),
    ("pdserve:kv_tier_bytes", "Bytes of the KV blocks the tier holds.", "num_bytes"),
    ("pdserve:kv_tier_capacity_bytes", "Bytes the tier may hold.", "capacity_bytes"),
)
_COUNTERS = (
    ("pdserve:kv_tier_hits", "Blocks found in the tier after the pool (and the tiers above) missed.", "num_hits"),
    ("pdserve:kv_tier_misses", "Blocks looked up in the tier and not found.", "num_misses"),
    ("pdserve:kv_tier_loads", "Blocks loaded from the tier into the pool.", "num_loads"),
    ("pdserve:kv_tier_stores", "Blocks this instance wrote into the tier.", "num_stores"),
    ("pdserve:kv_tier_evictions", "Blocks this instance's stores pushed out of the tier.", "num_evictions"),
    ("pdserve:kv_tier_corrupt_blocks", "Blocks that failed their checksum (dropped and recomputed).", "num_corrupt"),
    ("pdserve:kv_tier_busy_skips", "Tier operations (lookups, loads, stores, publishes, listings) given up "
     "because another process held the tier's lock past its patience (a stopped process of the host).",
     "num_busy_skips"),
    ("pdserve:kv_tier_load_seconds", "Seconds spent loading blocks from the tier.", "load_seconds"),
    ("pdserve:kv_tier_recompute_avoided_tokens", "Prompt tokens loaded from the tier instead of computed.",
     "recompute_avoided_tokens"),
)


def tier_families(make: FamilyMaker, tiers: Iterable[KVTierStats]) -> Iterator:
    tiers = list(tiers)
    for name, documentation, attribute in _GAUGES:
        yield make.labelled(GaugeMetricFamily, name, documentation, ("tier",),
                            (((tier.tier,), getattr(tier, attribute)) for tier in tiers))
    for name, documentation, attribute in _COUNTERS:
        yield make.labelled(CounterMetricFamily, name, documentation, ("tier",),
                            (((tier.tier,), getattr(tier, attribute)) for tier in tiers))
    rows = [((tier.tier, "load"), tier.num_load_decisions) for tier in tiers]
    rows += [((tier.tier, "recompute"), tier.num_recompute_decisions) for tier in tiers]
    yield make.labelled(CounterMetricFamily, "pdserve:kv_tier_decisions", "Load-or-recompute choices, by what "
                        "was measured cheaper.", ("tier", "decision"), rows)
