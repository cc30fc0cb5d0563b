"""What every relayed request shares: the cluster view, instance channels, counters, knobs,
and the background tasks (reservation releases) that must outlive a cancelled request."""

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field

import grpc

from shared.errors import REQUEST_FAILED_METADATA_KEY

from services.gateway.channels import InstanceChannels
from services.gateway.cluster_view import ClusterView
from services.gateway.decode_room import DecodeRoom
from services.gateway.placement import PlacementPolicy
from services.gateway.stats import GatewayStats

logger = logging.getLogger(__name__)

# Instance failures worth trying another instance for (the process died, restarted, or
# refused); DEADLINE_EXCEEDED is not among them: the request's own time is spent.
FAILOVER_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED, grpc.StatusCode.RESOURCE_EXHAUSTED,
})


def is_failover(error: grpc.aio.AioRpcError) -> bool:
    """True when another instance may succeed: a FAILOVER_CODES failure of the instance, not
    of the request itself (which failed in the engine and would fail anywhere)."""
    if error.code() not in FAILOVER_CODES:
        return False
    return not any(key == REQUEST_FAILED_METADATA_KEY for key, _ in (error.trailing_metadata() or ()))


@dataclass(frozen=True)
class HangTimeouts:
    """How long the gateway waits on an instance that may be hung (alive, not answering):
    the gateway settings control_call_timeout_s, stall_timeout_s and health_probe_timeout_s."""

    control_call_s: float = 10.0  # Reserve, Release, Renew answer at once when the instance runs
    stall_s: float = 5.0  # no message on a stream for this long: probe the instances' health
    health_probe_s: float = 2.0  # no health answer within this: the instance is lost (hung or dead)


@dataclass
class RelayContext:
    view: ClusterView
    channels: InstanceChannels
    stats: GatewayStats = field(default_factory=GatewayStats)
    max_prefill_retries: int = 2
    lease_s: float = 30.0
    prefer_colocated: bool = False
    placement: PlacementPolicy = field(default_factory=PlacementPolicy)  # conditional disaggregation
    hang: HangTimeouts = field(default_factory=HangTimeouts)
    # Requests every decode instance refused for want of room wait their turn (at most this).
    max_room_wait_s: float = 300.0
    room: DecodeRoom = field(default_factory=DecodeRoom)
    background: set[asyncio.Task] = field(default_factory=set)

    def spawn(self, coroutine: Coroutine, name: str) -> asyncio.Task:
        """Run a coroutine that must finish even if the request that started it is cancelled."""
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self.background.add(task)
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("background task %s failed: %r", task.get_name(), task.exception())

    async def drain_background(self) -> None:
        if self.background:
            await asyncio.gather(*self.background, return_exceptions=True)
