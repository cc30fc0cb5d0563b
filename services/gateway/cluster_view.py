"""The gateway's read-only view of the cluster: live instances (cached briefly) and how much
of a prompt each one holds (one prefix-index round trip per request).

Redis trouble never fails a request by itself: the last good listing is reused (logged) and
prefix overlap counts as zero. Instances that failed a call recently are marked suspect for
`suspect_s`, so routing tries them last until their registration lapses.
"""

import asyncio
import logging
import time
from collections.abc import Callable

from shared.cluster.instances import InstanceInfo, InstanceLoad, InstanceRegistry
from shared.cluster.prefix_index import PrefixIndex

from services.gateway.router import Candidate

logger = logging.getLogger(__name__)

Listing = list[tuple[InstanceInfo, InstanceLoad]]


class ClusterView:
    def __init__(self, registry: InstanceRegistry, prefix_index: PrefixIndex, cache_s: float = 0.5,
                 suspect_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.registry = registry
        self.prefix_index = prefix_index
        self.cache_s = cache_s
        self.suspect_s = suspect_s
        self.clock = clock
        self.num_redis_errors = 0
        self._listing: Listing | None = None
        self._listed_at = float("-inf")
        self._suspect_until: dict[str, float] = {}

    async def live(self) -> Listing:
        """Live instances, from a listing at most cache_s old (or the last good one)."""
        now = self.clock()
        if self._listing is not None and now - self._listed_at < self.cache_s:
            return self._listing
        try:
            self._listing = await self.registry.list_live()
            self._listed_at = now
        except Exception as error:  # noqa: BLE001 - Redis down: keep serving with what we knew
            self.num_redis_errors += 1
            logger.warning("listing instances failed (%r); using the last listing", error)
            if self._listing is None:
                return []
        return self._listing

    async def candidates(self, block_hashes: list[bytes]) -> list[Candidate]:
        """Every live instance with the number of leading prompt blocks it holds."""
        listing = await self.live()
        overlap = await self._overlap(block_hashes, [info.instance_id for info, _ in listing])
        now = self.clock()
        return [Candidate(instance_id=info.instance_id, role=info.role, grpc_address=info.grpc_address,
                          prefix_blocks=overlap.get(info.instance_id, 0),
                          free_blocks=load.num_free_blocks, total_blocks=load.num_total_blocks,
                          num_running=load.num_running_requests, queue_depth=load.queue_depth,
                          is_suspect=self._suspect_until.get(info.instance_id, 0.0) > now)
                for info, load in listing]

    async def _overlap(self, block_hashes: list[bytes], instance_ids: list[str]) -> dict[str, int]:
        if not block_hashes or not instance_ids:
            return {}
        try:
            return await self.prefix_index.longest_prefix(block_hashes, instance_ids)
        except Exception as error:  # noqa: BLE001 - route by load alone
            self.num_redis_errors += 1
            logger.warning("prefix lookup failed (%r); routing by load", error)
            return {}

    def mark_failed(self, instance_id: str) -> None:
        """An instance failed a call: try it last for a while, and re-list soon."""
        now = self.clock()
        self._suspect_until = {i: t for i, t in self._suspect_until.items() if t > now}
        self._suspect_until[instance_id] = now + self.suspect_s
        self._listed_at = float("-inf")

    async def collect_garbage_forever(self, interval_s: float) -> None:
        """Drop the prefix-index entries of instances whose registration lapsed (killed or
        partitioned ones never clean up after themselves). Runs until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                live_ids = await self.registry.live_instance_ids()
                dropped = await self.prefix_index.collect_garbage(live_ids)
            except Exception as error:  # noqa: BLE001 - Redis down: try again next round
                logger.warning("prefix-index garbage collection failed (%r)", error)
                continue
            if dropped:
                logger.info("dropped the prefix index of dead instances %s", dropped)

    async def ping(self) -> bool:
        try:
            return bool(await self.registry.redis.ping())
        except Exception:  # noqa: BLE001
            return False
