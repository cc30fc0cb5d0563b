"""Which prefill and decode instances may work together: only those whose registered cache
settings agree (shared.cluster.cache_settings.PAIRED_FIELDS) and whose KV wire protocol
versions agree (shared.cluster.versions: during a rolling upgrade, old and new instances of
different protocols run side by side and are never paired), since a prefill instance writes
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
from shared.cluster.versions import UNREGISTERED_PROTOCOL

logger = logging.getLogger(__name__)


def can_pair(prefill, decode) -> bool:
    """True when KV that `prefill` computes can be used by `decode` (each an InstanceInfo or a
    Candidate: their cache settings and KV protocol versions agree)."""
    key = pairing_key(prefill)
    return key is not None and key == pairing_key(decode)


def pairing_key(instance) -> tuple | None:
    """Equal for two instances exactly when they can pair; None for one that registered no
    cache settings or no KV protocol version."""
    key = paired_key(instance.cache)
    if key is None or instance.kv_protocol_version == UNREGISTERED_PROTOCOL:
        return None
    return (*key, instance.kv_protocol_version)


def describe_mismatch(prefill, decode) -> str:
    """e.g. "prefill p0 and decode d0 differ in cache settings (block_size 16 != 32)", or
    "... differ in KV protocol version (2 != 3; pdserve 0.1.0 != 0.2.0)"."""
    reasons = []
    cache_reasons = cache_mismatches(prefill.cache, decode.cache)
    if cache_reasons:
        reasons.append(f"cache settings ({', '.join(cache_reasons)})")
    if prefill.kv_protocol_version != decode.kv_protocol_version or (
            prefill.kv_protocol_version == UNREGISTERED_PROTOCOL):
        reasons.append(f"KV protocol version ({_protocol(prefill)} != {_protocol(decode)}; "
                       f"pdserve {prefill.pdserve_version or '?'} != {decode.pdserve_version or '?'})")
    return f"prefill {prefill.instance_id} and decode {decode.instance_id} differ in {' and '.join(reasons)}"


def _protocol(instance) -> str:
    version = instance.kv_protocol_version
    return "unregistered" if version == UNREGISTERED_PROTOCOL else str(version)


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
                        if not can_pair(p, d)}
        for key in sorted(incompatible.keys() - self._reported):
            prefill, decode = incompatible[key]
            logger.warning("%s: never paired", describe_mismatch(prefill, decode))
            self.num_pairs_reported += 1
        self._reported = set(incompatible)  # a pair that leaves and returns is logged again
        self.num_incompatible_pairs = len(incompatible)
