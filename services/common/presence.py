"""An instance's presence in Redis: registration (with its cache settings, which gateways
read to hash prompts as it does and to pair it) and heartbeats carrying its load, its
prefix-index entry, and the mirror of its block leases. A draining instance stays registered,
as DRAINING (no reader gives it new work), with its prefix-index entry dropped, until it
withdraws. Never blocks serving on Redis:
every Redis write happens in background tasks that retry, and shutdown is best effort.
"""

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable

from shared.cluster.heartbeat import Heartbeater
from shared.cluster.instances import InstanceInfo, InstanceLoad, InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.cluster.lease_mirror import LeaseMirror
from shared.cluster.prefix_index import PrefixIndex
from shared.cluster.task_stop import stop_task
from shared.cluster.tier_board import TierBoard
from shared.engine_api.client import EngineClient
from services.common.prefix_publisher import PrefixPublisher
from services.common.redis_client import redis_client
from services.common.settings import InstanceSettings

logger = logging.getLogger(__name__)

# Longest wait between heartbeats while Redis is away, so a restarted Redis learns of this
# instance (and its prefix cache and leases) within about a second.
MAX_HEARTBEAT_BACKOFF_S = 1.0


def instance_load(engine: EngineClient) -> InstanceLoad:
    """The load a heartbeat reports; reservations count as queued work."""
    load = engine.load()
    return InstanceLoad(queue_depth=load.num_waiting + load.num_reserved, num_running_requests=load.num_running,
                        num_prefilling=load.num_prefilling,
                        num_free_blocks=load.num_free_blocks, num_total_blocks=load.num_total_blocks,
                        resident_lora_adapters=tuple(load.resident_lora_adapters))


class ClusterPresence:
    def __init__(self, settings: InstanceSettings, model_key: str):
        self.settings = settings
        self.namespace = ClusterNamespace(settings.deployment, model_key)
        # Every Redis operation below gives up after this (--redis-socket-timeout-s).
        self.op_timeout_s = settings.redis_socket_timeout_s
        self.redis = redis_client(settings, settings.redis_url)
        self.registry = InstanceRegistry(self.redis, self.namespace, ttl_s=settings.heartbeat_ttl_s)
        self.prefix_index = PrefixIndex(self.redis, self.namespace)
        self.lease_mirror = LeaseMirror(self.redis, self.namespace, op_timeout_s=self.op_timeout_s)
        self.tier_board = TierBoard(self.redis, self.namespace, settings.heartbeat_ttl_s)
        self.heartbeater: Heartbeater | None = None
        self.publisher: PrefixPublisher | None = None
        self._tier_task: asyncio.Task | None = None
        # Tiers the engine does not keep (the prefill handler's peer pulls), for the tier board.
        self.read_more_tiers: Callable[[], tuple] = tuple
        # Called after a Redis restart (or lapse) once re-registered: republish what Redis lost.
        self.resync_hooks: list[Callable[[], Awaitable[None] | None]] = []
        self.is_draining = False

    def start(self, info: InstanceInfo, engine: EngineClient) -> None:
        """Register (first beat), then keep beating and publishing the prefix index."""
        self.is_draining = info.is_draining
        self.publisher = PrefixPublisher(self.prefix_index, info.instance_id, engine,
                                         self.settings.prefix_publish_interval_s, op_timeout_s=self.op_timeout_s,
                                         tier_id=info.kv_tier_id)
        self.heartbeater = Heartbeater(self.registry, info, lambda: instance_load(engine),
                                       interval_s=self.settings.heartbeat_interval_s,
                                       on_reconnect=self._resync,
                                       max_backoff_s=min(MAX_HEARTBEAT_BACKOFF_S,
                                                         self.settings.heartbeat_interval_s),
                                       beat_timeout_s=self.op_timeout_s)
        self.heartbeater.start()
        self.publisher.start()
        self._tier_task = asyncio.get_running_loop().create_task(self._publish_tiers_forever(info.instance_id, engine))
        logger.info("registering %s (%s) at %s in %s with cache settings %s", info.instance_id, info.role,
                    info.grpc_address, self.namespace.prefix, info.cache)

    async def update_info(self, info: InstanceInfo, engine: EngineClient) -> None:
        """Tell the cluster at once what changed (the LoRA adapters served); a heartbeat that
        re-registers carries it too. Redis trouble is logged: the next beats write it."""
        if self.heartbeater is None:
            return
        self.heartbeater.info = info
        try:
            async with asyncio.timeout(self.op_timeout_s):
                await self.registry.update_info(info, instance_load(engine))
        except Exception as error:  # noqa: BLE001 - the registration catches up on the next beats
            logger.warning("updating the registration of %s failed (%r)", info.instance_id, error)

    async def mark_draining(self, info: InstanceInfo, engine: EngineClient) -> None:
        """Stay registered and beating, as DRAINING (`info.state`), so `pdserve status` shows
        the instance while it finishes its work; stop publishing and drop the prefix-index
        entry. Redis trouble is logged: the next beats carry the state."""
        if self.heartbeater is None:
            return
        self.is_draining = True
        if self.publisher is not None:
            await self.publisher.stop()
            await self.publisher.drop()
        await self.update_info(info, engine)

    async def _resync(self) -> None:
        """Republish the prefix index (not while draining), then whatever the role handlers
        keep in Redis (leases)."""
        if not self.is_draining:
            await self.publisher.republish()
        await run_resync_hooks(self.resync_hooks)

    async def _publish_tiers_forever(self, instance_id: str, engine: EngineClient) -> None:
        """The tier counters for `pdserve status`, every heartbeat interval (Redis trouble:
        logged at debug, the next round retries)."""
        while True:
            try:
                tiers = [*engine.latest_status().kv_tiers, *self.read_more_tiers()]
                async with asyncio.timeout(self.op_timeout_s):
                    await self.tier_board.write(instance_id, tiers)
            except Exception as error:  # noqa: BLE001 - status only: never fails serving
                logger.debug("tier board of %s not written: %r", instance_id, error)
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    async def withdraw(self) -> None:
        """Leave routing: stop beating and deregister, stop publishing and drop the prefix-index
        entry (best effort). Lease mirroring carries on until `close`."""
        if self._tier_task is not None:
            await stop_task(self._tier_task, "the KV tier publisher")
            self._tier_task = None
        if self.publisher is not None:
            await self.publisher.stop()
        if self.heartbeater is not None:
            await self.heartbeater.stop()
        if self.publisher is not None:
            await self.publisher.drop()
        self.heartbeater = None

    async def close(self) -> None:
        """After the last lease is released: flush the lease mirror, then close the client."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.op_timeout_s):
                await self.lease_mirror.flush()
        await self.lease_mirror.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.op_timeout_s):
                await self.redis.aclose()


async def run_resync_hooks(hooks: list[Callable[[], Awaitable[None] | object]]) -> None:
    """Call each hook, awaiting those that return an awaitable (a plain function may return
    anything, e.g. LeaseTable.republish's count)."""
    for hook in hooks:
        result = hook()
        if inspect.isawaitable(result):
            await result
