"""Keeps this instance's entry in the Redis prefix index true.

Every `interval_s` it takes the engine's KV-cache events (blocks stored into and evicted from
the prefix cache since the last call, netted) through the engine API and applies them (SREM
removed, SADD stored). When Redis fails, when the Heartbeater reconnects (Redis restarted
empty), or when the engine dropped events nobody drained, it republishes everything instead:
`replace_all` with a snapshot of every cached hash, taken together with draining the events,
so the index never misses a change. One lock orders the two paths.

The host's KV tiers have an entry too (`prefix:tier:{tier_id}`, shared by the instances of the
host): each instance adds the blocks it stored there and removes those its stores evicted;
a republish replaces the entry with everything the tiers hold.
"""

import asyncio
import logging

from shared.cluster.prefix_index import PrefixIndex
from shared.cluster.task_stop import stop_task
from shared.engine_api.client import EngineClient, KVCacheEvents

logger = logging.getLogger(__name__)


class PrefixPublisher:
    def __init__(self, index: PrefixIndex, instance_id: str, engine: EngineClient, interval_s: float,
                 op_timeout_s: float = 2.0, tier_id: str = ""):
        """`tier_id`: the host's KV tiers in the index ("": none)."""
        self.index = index
        self.instance_id = instance_id
        self.tier_id = tier_id
        self.engine = engine
        self.interval_s = interval_s
        self.op_timeout_s = op_timeout_s
        self.num_failures = 0
        self._needs_republish = True  # the first tick replaces whatever a former life left
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task, f"the prefix-index publisher of {self.instance_id}")
            self._task = None

    async def drop(self) -> None:
        """Remove this instance's entry (clean shutdown; best effort, never raises)."""
        try:
            async with asyncio.timeout(self.op_timeout_s):
                await self.index.drop_instance(self.instance_id)
        except Exception as error:  # noqa: BLE001 - shutdown must not fail on Redis
            logger.warning("dropping the prefix index of %s failed: %r", self.instance_id, error)

    async def republish(self) -> None:
        """Replace this instance's entry with everything cached now (raises on Redis failure)."""
        async with self._lock:
            await self._replace_all(await self.engine.kv_events(snapshot=True))

    async def _replace_all(self, events: KVCacheEvents) -> None:
        self._needs_republish = True
        async with asyncio.timeout(self.op_timeout_s):
            await self.index.replace_all(self.instance_id, list(events.stored))
            await self._publish_tier(events)
        self._needs_republish = False
        logger.info("prefix index of %s republished: %d blocks", self.instance_id, len(events.stored))

    async def publish_changes(self) -> None:
        """Apply the changes since the last call (raises on Redis failure; next tick republishes)."""
        async with self._lock:
            events = await self.engine.kv_events()
            if events.is_snapshot:  # the engine dropped events nobody drained
                await self._replace_all(events)
                return
            self._needs_republish = True
            async with asyncio.timeout(self.op_timeout_s):
                await self.index.remove(self.instance_id, list(events.removed))
                await self.index.add(self.instance_id, list(events.stored))
                await self._publish_tier(events)
            self._needs_republish = False

    async def _publish_tier(self, events: KVCacheEvents) -> None:
        if not self.tier_id:
            return
        if events.is_tier_snapshot:
            await self.index.replace_tier(self.tier_id, list(events.tier_stored))
        else:
            await self.index.update_tier(self.tier_id, list(events.tier_stored), list(events.tier_removed))

    async def _run(self) -> None:
        while True:
            try:
                if self._needs_republish:
                    await self.republish()
                else:
                    await self.publish_changes()
            except Exception as error:  # noqa: BLE001 - Redis down: republish once it is back
                self.num_failures += 1
                logger.warning("prefix index update of %s failed: %r", self.instance_id, error)
            await asyncio.sleep(self.interval_s)
