"""Keeps this instance's entry in the Redis prefix index true.

Every `interval_s` it drains the block pool's stored/evicted events on the engine thread and
applies their net effect (SREM evicted, SADD stored). When Redis fails, or when the
Heartbeater reconnects (Redis restarted empty), it republishes everything instead:
`replace_all` with the pool's cached hashes, snapshotted on the engine thread together with
draining the events, so the index never misses a change. One lock orders the two paths.
"""

import asyncio
import contextlib
import logging

from shared.cluster.prefix_index import PrefixIndex
from shared.engine.async_engine import AsyncEngine
from shared.kv_cache.block_pool import BlockPool

logger = logging.getLogger(__name__)


def net_changes(pool: BlockPool) -> tuple[list[bytes], list[bytes]]:
    """(stored, evicted) since the last drain; a hash in both ends as the pool has it now."""
    events = pool.drain_events()
    stored, evicted = set(events.stored), set(events.evicted)
    both = stored & evicted
    if both:
        cached = set(pool.cached_hashes())
        stored -= both - cached
        evicted -= both & cached
    return sorted(stored), sorted(evicted)


def snapshot(pool: BlockPool) -> list[bytes]:
    """Every cached hash, dropping the pending events that the snapshot already reflects."""
    pool.drain_events()
    return pool.cached_hashes()


class PrefixPublisher:
    def __init__(self, index: PrefixIndex, instance_id: str, engine: AsyncEngine, interval_s: float,
                 op_timeout_s: float = 2.0):
        self.index = index
        self.instance_id = instance_id
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
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
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
            hashes = await self.engine.call(snapshot, self.engine.engine.block_pool)
            async with asyncio.timeout(self.op_timeout_s):
                await self.index.replace_all(self.instance_id, hashes)
            self._needs_republish = False
            logger.info("prefix index of %s republished: %d blocks", self.instance_id, len(hashes))

    async def publish_changes(self) -> None:
        """Apply the changes since the last call (raises on Redis failure; next tick republishes)."""
        async with self._lock:
            stored, evicted = await self.engine.call(net_changes, self.engine.engine.block_pool)
            self._needs_republish = True
            async with asyncio.timeout(self.op_timeout_s):
                await self.index.remove(self.instance_id, evicted)
                await self.index.add(self.instance_id, stored)
            self._needs_republish = False

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
