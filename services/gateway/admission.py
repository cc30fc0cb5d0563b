"""Load shedding: an admission limit on the prompts that wait for their first token.

A request waits for its first token while its prompt is queued or prefilled. Above capacity
that wait grows without bound until the requests' deadlines fire, so every request fails late
instead of a few failing early. The gateway admits a new request only while the prompts
waiting for a first token stay under `max_queued_per_instance` times the live instances that
compute prompts (prefill instances; colocated ones when no prefill instance is live).

The waiting prompts are counted twice and the larger count wins: the pool's own (each prompt
instance's queued prompts and running ones without a first token at its last heartbeat, which includes the other gateways'
requests) and this gateway's requests still waiting for their first token (exact, without the
heartbeats' lag, so a burst cannot overshoot). A request over the limit fails at once with
RESOURCE_EXHAUSTED (HTTP 429), a message naming the limit, and a Retry-After of about one turn
of the queue (the recent wait for a first token); it is refused before anything is reserved,
so it leaves nothing behind. The per-key limits (services.gateway.rate_limits) are separate:
they share a gateway fairly among keys, this keeps the pool's queue short for everyone.
"""

import math
import time
from collections.abc import Callable, Iterable

import grpc

from shared.cluster.instances import InstanceInfo, InstanceLoad

from services.gateway.errors import GatewayError

PROMPT_ROLES = ("prefill", "colocated")
SETTING = "max_queued_per_instance"
# The recent wait for a first token, smoothed: each admitted request's wait weighs this much.
WAIT_SMOOTHING = 0.2
INITIAL_WAIT_S = 1.0
MAX_RETRY_AFTER_S = 60.0


def prompt_pool(listing: Iterable[tuple[InstanceInfo, InstanceLoad]]) -> tuple[int, int]:
    """(live instances that compute prompts, prompts queued or being prefilled on them by their
    heartbeats): the prefill pool, or the colocated instances when no prefill instance is live. A
    colocated instance's decoding requests are not waiting for a first token and do not count."""
    by_role: dict[str, list[InstanceLoad]] = {role: [] for role in PROMPT_ROLES}
    for info, load in listing:
        if info.role in by_role:
            by_role[info.role].append(load)
    loads = by_role["prefill"] or by_role["colocated"]
    return len(loads), sum(load.queue_depth + load.num_prefilling for load in loads)


class Ticket:
    """One admitted request: `first_token()` once its first token arrived (or it ended), then
    `release()` (idempotent) when it ends; both may be called in any order."""

    def __init__(self, admission: "Admission", admitted_at: float):
        self._admission = admission
        self._admitted_at = admitted_at
        self._is_waiting = True

    def first_token(self) -> None:
        if self._is_waiting:
            self._is_waiting = False
            self._admission._done_waiting(self._admission.clock() - self._admitted_at)

    def release(self) -> None:
        if self._is_waiting:
            self._is_waiting = False
            self._admission.num_waiting -= 1  # ended without a token: its wait says nothing


class Admission:
    def __init__(self, max_queued_per_instance: int = 0, clock: Callable[[], float] = time.monotonic):
        self.max_queued_per_instance = max_queued_per_instance  # 0: no limit
        self.clock = clock
        self.num_waiting = 0  # this gateway's admitted requests without a first token yet
        self.num_shed = 0
        self.recent_wait_s = INITIAL_WAIT_S

    @property
    def is_enabled(self) -> bool:
        return self.max_queued_per_instance > 0

    def admit(self, num_instances: int, pool_waiting: int) -> Ticket:
        """A ticket for a new request, or GatewayError RESOURCE_EXHAUSTED (with retry_after_s)
        when the waiting prompts already fill the limit. With no instance live the request is
        admitted: routing then answers UNAVAILABLE, which says more."""
        limit = self.max_queued_per_instance * num_instances
        waiting = max(pool_waiting, self.num_waiting)
        if self.is_enabled and num_instances > 0 and waiting >= limit:
            self.num_shed += 1
            raise self.overloaded(waiting, num_instances, limit)
        self.num_waiting += 1
        return Ticket(self, self.clock())

    def overloaded(self, waiting: int, num_instances: int, limit: int) -> GatewayError:
        retry_after_s = self.retry_after_s()
        return GatewayError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"overloaded: {waiting} requests wait for their first token on {num_instances} prompt instance(s), "
            f"the limit is {limit} ({SETTING}={self.max_queued_per_instance} per instance); "
            f"retry after {math.ceil(retry_after_s)} s", retry_after_s=retry_after_s)

    def retry_after_s(self) -> float:
        """About one turn of the queue: the recent wait for a first token."""
        return min(MAX_RETRY_AFTER_S, max(1.0, self.recent_wait_s))

    def _done_waiting(self, wait_s: float) -> None:
        self.num_waiting -= 1
        self.recent_wait_s += WAIT_SMOOTHING * (wait_s - self.recent_wait_s)
