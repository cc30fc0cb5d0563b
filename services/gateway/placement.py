"""Conditional disaggregation: whether a prompt is prefilled on the prefill pool (its KV then
sent to the decode instance) or on the decode instance itself (no prefill hop, no transfer).

Decided per completion once a decode instance granted the reservation, whose answer says how
many of the prompt's tokens it holds already; the rest are the prompt's uncached tokens there.
The rules, in order (as NVIDIA Dynamo's disaggregated router and llm-d's P/D decider: a prompt
short enough after the decode side's prefix-cache hits stays local; see the README section
"Conditional disaggregation" for how the thresholds come from `pdserve profile`):

1. uncached tokens <= `max_local_tokens`: decode_local, reason "short_prompt";
2. the prefill pool is busy (each prefill instance that can feed this decode instance has at
   least `busy_backlog` prompts queued or running by its last heartbeat, or none is live) and
   uncached tokens <= `busy_max_local_tokens`: decode_local, reason "prefill_busy";
3. otherwise prefill_pool, reason "long_prompt" ("off" when neither local rule is on).

The decode instance has the last word: it refuses a local prefill its budget has no room for
(services.decode.local_prefill), and the prompt then goes to the pool ("decode_refused").
"""

from collections.abc import Iterable
from dataclasses import dataclass

from services.gateway.router import Candidate

DECODE_LOCAL = "decode_local"
PREFILL_POOL = "prefill_pool"


@dataclass(frozen=True)
class PlacementPolicy:
    max_local_tokens: int = 0  # 0: rule 1 off
    busy_max_local_tokens: int = 0  # 0: rule 2 off
    busy_backlog: int = 0  # 0: the pool never counts as busy

    @property
    def is_off(self) -> bool:
        return self.max_local_tokens == 0 and (self.busy_max_local_tokens == 0 or self.busy_backlog == 0)


@dataclass(frozen=True)
class Placement:
    where: str  # DECODE_LOCAL or PREFILL_POOL
    reason: str

    @property
    def is_local(self) -> bool:
        return self.where == DECODE_LOCAL


def place_prefill(policy: PlacementPolicy, num_uncached_tokens: int, prefill_backlog: int | None) -> Placement:
    """Where to prefill a prompt with `num_uncached_tokens` to compute on the decode instance;
    `prefill_backlog`: prompts queued or running on the least loaded prefill instance that can
    feed it (None: none is live)."""
    if policy.is_off:
        return Placement(PREFILL_POOL, "off")
    if num_uncached_tokens <= policy.max_local_tokens:
        return Placement(DECODE_LOCAL, "short_prompt")
    is_busy = policy.busy_backlog > 0 and (prefill_backlog is None or prefill_backlog >= policy.busy_backlog)
    if is_busy and num_uncached_tokens <= policy.busy_max_local_tokens:
        return Placement(DECODE_LOCAL, "prefill_busy")
    return Placement(PREFILL_POOL, "long_prompt")


def prefill_backlog(prefills: Iterable[Candidate]) -> int | None:
    """Prompts queued or running on the least loaded of these prefill instances (heartbeats);
    instances that failed recently count only when no other is left."""
    prefills = list(prefills)
    healthy = [c for c in prefills if not c.is_suspect] or prefills
    return min((c.queue_depth + c.num_running for c in healthy), default=None)
