"""Pure routing decisions: which instance of a role to try, in order.

Decode instances are ranked by (prefix blocks held desc, free blocks desc, running asc),
prefill instances by (prefix blocks held desc, queue depth asc, running asc), colocated
ones by (prefix blocks held desc, queue + running asc, free blocks desc). For a LoRA
adapter's request, among instances holding equally many prefix blocks those that have the
adapter in memory come first, before load: a prefix hit saves computing its blocks, a resident
adapter only saves reading its files (and an instance with a prefix hit for the adapter ran it
recently), so prefix blocks weigh more, but load does not override the adapter. Blocks held count
those in the instance's pool fully and those beyond them in its host's KV tiers at
TIER_BLOCK_WEIGHT (a load from the host tier costs a small fraction of computing the block:
docs/kv_tiers.md), so a pool hit still wins a tie against the same run in a tier. The instance id
breaks remaining ties, so decisions are deterministic. Instances that already failed for
this request are excluded; instances that failed recently for any request ("suspect") go
last. `plan_route` decides between the disaggregated pair and a colocated instance. A prefill
and a decode instance form a pair only when their cache settings and KV protocol versions agree
(services.gateway.pairing).
"""

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from shared.cluster.versions import KV_PROTOCOL_VERSION
from shared.engine_api.client import CacheSettings

from services.gateway.pairing import can_pair, describe_mismatch, pairing_key

DISAGGREGATED = "disaggregated"
TIER_BLOCK_WEIGHT = 0.9
COLOCATED = "colocated"


@dataclass(frozen=True)
class Candidate:
    instance_id: str
    role: str
    grpc_address: str
    prefix_blocks: int = 0  # leading prompt blocks the instance holds (its pool)
    tier_blocks: int = 0  # leading prompt blocks beyond those that its host's KV tiers hold
    free_blocks: int = 0
    total_blocks: int = 0
    num_running: int = 0
    queue_depth: int = 0
    is_suspect: bool = False
    cache: CacheSettings | None = None  # as registered; None: an instance that registered none
    kv_protocol_version: int = KV_PROTOCOL_VERSION  # as registered (shared.cluster.versions)
    pdserve_version: str = ""
    has_adapter: bool = False  # holds the request's LoRA adapter in memory (False for base requests)


    @property
    def held_blocks(self) -> float:
        """Pool blocks, plus tier blocks at what they are worth (TIER_BLOCK_WEIGHT)."""
        return self.prefix_blocks + TIER_BLOCK_WEIGHT * self.tier_blocks

    @property
    def local_blocks(self) -> int:
        """Leading prompt blocks it can use without computing them: its pool's and its tiers'."""
        return self.prefix_blocks + self.tier_blocks


@dataclass(frozen=True)
class Choice:
    """An ordered list of instances to try and why the first one leads."""

    ranked: list[Candidate]
    reason: str  # "prefix", "adapter", "load" or "only" (or "none" when ranked is empty)


def _decode_key(c: Candidate):
    return (c.is_suspect, -c.held_blocks, not c.has_adapter, -c.free_blocks, c.num_running, c.instance_id)


def _prefill_key(c: Candidate):
    return (c.is_suspect, -c.held_blocks, not c.has_adapter, c.queue_depth, c.num_running, c.instance_id)


def _colocated_key(c: Candidate):
    return (c.is_suspect, -c.held_blocks, not c.has_adapter, c.queue_depth + c.num_running, -c.free_blocks,
            c.instance_id)


_KEYS = {"decode": _decode_key, "prefill": _prefill_key, "colocated": _colocated_key}


def rank(candidates: Iterable[Candidate], role: str, excluded: Collection[str] = ()) -> Choice:
    """Instances of `role` not in `excluded`, best first."""
    ranked = sorted((c for c in candidates if c.role == role and c.instance_id not in excluded),
                    key=_KEYS[role])
    return Choice(ranked, _reason(ranked))


def _reason(ranked: list[Candidate]) -> str:
    if not ranked:
        return "none"
    if len(ranked) == 1:
        return "only"
    first, second = ranked[0], ranked[1]
    if first.held_blocks > second.held_blocks and not first.is_suspect:
        return "prefix"
    if first.has_adapter and not second.has_adapter and not first.is_suspect:
        return "adapter"
    return "load"


def pairable_decodes(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Decode instances that some live prefill instance can feed."""
    candidates = list(candidates)
    prefill_keys = {pairing_key(c) for c in candidates if c.role == "prefill"} - {None}
    return [c for c in candidates if c.role == "decode" and pairing_key(c) in prefill_keys]


def prefills_for(decode: Candidate, candidates: Iterable[Candidate]) -> list[Candidate]:
    """Prefill instances whose KV `decode` can take."""
    return [c for c in candidates if c.role == "prefill" and can_pair(c, decode)]


def plan_route(candidates: Iterable[Candidate], prefer_colocated: bool = False) -> str | None:
    """DISAGGREGATED when a prefill and a decode instance that can pair are live, else
    COLOCATED when a colocated one is (or first when preferred); None when nothing can serve."""
    candidates = list(candidates)
    has_pair = bool(pairable_decodes(candidates))
    has_colocated = any(c.role == COLOCATED for c in candidates)
    if has_colocated and (prefer_colocated or not has_pair):
        return COLOCATED
    return DISAGGREGATED if has_pair else None


def missing_roles(candidates: Iterable[Candidate]) -> list[str]:
    """Roles absent from the listing, for the UNAVAILABLE message."""
    roles = {c.role for c in candidates}
    return [role for role in ("prefill", "decode") if role not in roles]


def no_pair_reason(candidates: Iterable[Candidate]) -> str:
    """Why no disaggregated pair exists, for the UNAVAILABLE message: the missing roles, or
    the first prefill/decode mismatch (by instance id)."""
    candidates = list(candidates)
    missing = missing_roles(candidates)
    if missing:
        return f"no live {' or '.join(missing)} instance"
    prefill = min((c for c in candidates if c.role == "prefill"), key=lambda c: c.instance_id)
    decode = min((c for c in candidates if c.role == "decode"), key=lambda c: c.instance_id)
    mismatch = describe_mismatch(prefill, decode)
    return f"no prefill and decode instance can pair: {mismatch}"
