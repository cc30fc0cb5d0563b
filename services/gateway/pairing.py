"""Which prefill and decode instances may work together: only those whose registered cache
settings agree (shared.cluster.cache_settings.PAIRED_FIELDS), since a prefill instance writes
its KV straight into the decode instance's blocks. A pair that differs would miss the prefix
cache silently or fail its KV transfer late; the gateway never forms one.

PairingMonitor looks at every fresh listing of live instances: it logs each incompatible pair
once (while both stay listed) and counts them for the metrics.
"""

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from shared.cluster.cache_settings import cache_mismatches, paired_key
from shared.cluster.instances import InstanceInfo, InstanceLoad
from shared.engine.client import CacheSettings

logger = logging.getLogger(__name__)


def can_pair(prefill_cache: CacheSettings | None, decode_cache: CacheSettings | None) -> bool:
    """True when KV computed under `prefill_cache` can be used under `decode_cache`."""
    key = paired_key(prefill_cache)
    return key is not None and key == paired_key(decode_cache)


def describe_mismatch(prefill_id: str, prefill_cache: CacheSettings | None, decode_id: str,
                      decode_cache: CacheSettings | None) -> str:
    """e.g. "prefill p0 and decode d0 differ in cache settings (block_size 16 != 32)"."""
    return (f"prefill {prefill_id} and decode {decode_id} differ in cache settings "
            f"({', '.join(cache_mismatches(prefill_cache, decode_cache))})")


@dataclass
class PairingMonitor:
    num_incompatible_pairs: int = 0  # in the last listing (a gauge)
    num_pairs_reported: int = 0  # incompatible pairs logged so far (a counter)
    _reported: set[tuple[str, str]] = field(default_factory=set)

    def observe(self, listing: Iterable[tuple[InstanceInfo, InstanceLoad]]) -> None:
        infos = [info for info, _ in listing]
        prefills = [info for info in infos if info.role == "prefill"]
        decodes = [info for info in infos if info.role == "decode"]
        incompatible = {(p.instance_id, d.instance_id): (p, d) for p in prefills for d in decodes
                        if not can_pair(p.cache, d.cache)}
        for key in sorted(incompatible.keys() - self._reported):
            prefill, decode = incompatible[key]
            logger.warning("%s: never paired", describe_mismatch(prefill.instance_id, prefill.cache,
                                                                 decode.instance_id, decode.cache))
            self.num_pairs_reported += 1
        self._reported = set(incompatible)  # a pair that leaves and returns is logged again
        self.num_incompatible_pairs = len(incompatible)
