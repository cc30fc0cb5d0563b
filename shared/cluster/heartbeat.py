"""Heartbeater: the asyncio task an engine instance runs to stay registered.

The instance's service creates one at startup (`start()`), and `await stop()` at shutdown.
Every `interval_s` it registers/heartbeats through InstanceRegistry with the load that
`read_load()` reports. It never dies of Redis trouble: a failed beat is logged and retried
with exponential backoff (capped at `max_backoff_s`). After Redis comes back - or when a
beat finds the instance key gone (TTL lapse, Redis restarted empty) or Redis's run id changed
(a restart that kept some keys) - it calls
`on_reconnect()` so the instance republishes state Redis may have lost (its prefix index,
via PrefixIndex.replace_all); a failing `on_reconnect` is retried on the next beat.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from shared.cluster.instances import InstanceInfo, InstanceLoad, InstanceRegistry
from shared.cluster.task_stop import stop_task
from shared.errors import ConfigurationError

logger = logging.getLogger(__name__)


class Heartbeater:
    """Keeps one instance registered in Redis until stopped."""

    def __init__(
        self,
        registry: InstanceRegistry,
        info: InstanceInfo,
        read_load: Callable[[], InstanceLoad],
        interval_s: float = 1.0,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
        max_backoff_s: float = 10.0,
        beat_timeout_s: float = 2.0,
        is_deregister_on_stop: bool = True,
    ):
        for field, value in (("interval_s", interval_s), ("max_backoff_s", max_backoff_s),
                             ("beat_timeout_s", beat_timeout_s)):
            if not value > 0:
                raise ConfigurationError(field, f"must be > 0, got {value!r}")
        self.registry = registry
        self.info = info
        self.read_load = read_load
        self.interval_s = interval_s
        self.on_reconnect = on_reconnect
        self.max_backoff_s = max_backoff_s
        self.beat_timeout_s = beat_timeout_s
        self.is_deregister_on_stop = is_deregister_on_stop
        self.num_reconnects = 0  # on_reconnect calls that succeeded
        self.num_failed_beats = 0
        self._is_registered = False
        self._redis_run_id: str | None = None
        self._needs_resync = False
        self._stop_event = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Begin beating in the running event loop (the first beat registers)."""
        if self._task is not None:
            raise RuntimeError("Heartbeater already started")
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop beating and (by default) deregister, best effort; never raises for Redis."""
        self._stop_event.set()
        if self._task is not None:
            await stop_task(self._task, f"the heartbeat of {self.info.instance_id}")
        if self.is_deregister_on_stop and self._is_registered:
            try:
                async with asyncio.timeout(self.beat_timeout_s):
                    await self.registry.deregister(self.info.instance_id)
            except Exception as error:  # noqa: BLE001 - shutdown must not fail on Redis
                logger.warning("deregister of %s failed: %r", self.info.instance_id, error)

    async def _run(self) -> None:
        num_failures_in_row = 0
        while not self._stop_event.is_set():
            if await self._beat_once():
                num_failures_in_row = 0
                delay_s = self.interval_s
            else:
                num_failures_in_row += 1
                self.num_failed_beats += 1
                delay_s = min(self.max_backoff_s, self.interval_s * 2 ** (num_failures_in_row - 1))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_event.wait(), timeout=delay_s)

    async def _beat_once(self) -> bool:
        """One beat (plus a pending resync); False if anything failed."""
        try:
            async with asyncio.timeout(self.beat_timeout_s):
                is_key_recreated = await self._write_presence()
        except Exception as error:  # noqa: BLE001 - Redis down/slow: retry later
            logger.warning("heartbeat of %s failed: %r", self.info.instance_id, error)
            self._needs_resync = self._is_registered
            return False
        if is_key_recreated:
            logger.warning("instance %s was missing from Redis; re-registered",
                           self.info.instance_id)
            self._needs_resync = True
        return await self._resync_if_needed()

    async def _write_presence(self) -> bool:
        """Register on the first beat, heartbeat after; True if the key had vanished."""
        load = self.read_load()
        if not self._is_registered:
            await self.registry.register(self.info, load)
            self._is_registered = True
            self._redis_run_id = await self.registry.server_run_id()
            return False
        is_key_recreated = await self.registry.heartbeat(self.info.instance_id, load)
        return await self._is_redis_restarted() or is_key_recreated

    async def _is_redis_restarted(self) -> bool:
        run_id = await self.registry.server_run_id()
        is_restarted = self._redis_run_id is not None and run_id != self._redis_run_id
        self._redis_run_id = run_id
        return is_restarted

    async def _resync_if_needed(self) -> bool:
        if not self._needs_resync:
            return True
        try:
            if self.on_reconnect is not None:
                await self.on_reconnect()
        except Exception as error:  # noqa: BLE001 - retried on the next beat
            logger.warning("on_reconnect of %s failed: %r", self.info.instance_id, error)
            return False
        self._needs_resync = False
        self.num_reconnects += 1
        logger.info("instance %s reconnected to Redis", self.info.instance_id)
        return True
