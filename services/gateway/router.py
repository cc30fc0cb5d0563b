"""Pure routing decisions: which instance of a role to try, in order.

Decode instances are ranked by (prefix blocks held desc, free blocks desc, running asc),
prefill instances by (prefix blocks held desc, queue depth asc, running asc), colocated
ones by (prefix blocks held desc, queue + running asc, free blocks desc). The instance id
breaks remaining ties, so decisions are deterministic. Instances that already failed for
this request are excluded; instances that failed recently for any request ("suspect") go
last. `plan_route` decides between the disaggregated pair and a colocated instance.
"""

from collections.abc import Collection, Iterable
from dataclasses import dataclass

DISAGGREGATED = "disaggregated"
COLOCATED = "colocated"


@dataclass(frozen=True)
class Candidate:
    instance_id: str
    role: str
    grpc_address: str
    prefix_blocks: int = 0  # leading prompt blocks the instance holds
    free_blocks: int = 0
    total_blocks: int = 0
    num_running: int = 0
    queue_depth: int = 0
    is_suspect: bool = False


@dataclass(frozen=True)
class Choice:
    """An ordered list of instances to try and why the first one leads."""

    ranked: list[Candidate]
    reason: str  # "prefix", "load" or "only" (or "none" when ranked is empty)


def _decode_key(c: Candidate):
    return (c.is_suspect, -c.prefix_blocks, -c.free_blocks, c.num_running, c.instance_id)


def _prefill_key(c: Candidate):
    return (c.is_suspect, -c.prefix_blocks, c.queue_depth, c.num_running, c.instance_id)


def _colocated_key(c: Candidate):
    return (c.is_suspect, -c.prefix_blocks, c.queue_depth + c.num_running, -c.free_blocks,
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
    if first.prefix_blocks > second.prefix_blocks and not first.is_suspect:
        return "prefix"
    return "load"


def plan_route(candidates: Iterable[Candidate], prefer_colocated: bool = False) -> str | None:
    """DISAGGREGATED when a prefill and a decode instance are live, else COLOCATED when a
    colocated one is (or first when preferred); None when nothing can serve."""
    roles = {c.role for c in candidates}
    has_pair = {"prefill", "decode"} <= roles
    has_colocated = COLOCATED in roles
    if has_colocated and (prefer_colocated or not has_pair):
        return COLOCATED
    return DISAGGREGATED if has_pair else None


def missing_roles(candidates: Iterable[Candidate]) -> list[str]:
    """Roles absent from the listing, for the UNAVAILABLE message."""
    roles = {c.role for c in candidates}
    return [role for role in ("prefill", "decode") if role not in roles]
