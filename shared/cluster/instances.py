"""Instance registry: which engine instances are alive, what they are, how loaded.

Each instance keeps one Redis hash (InstanceInfo + InstanceLoad fields) with a TTL; the
instance's Heartbeater calls `heartbeat` every interval to refresh the TTL and load, so an
instance that stops beating disappears after `ttl_s`. Gateways call `list_live` to route.
A draining instance stays registered with state DRAINING until its accepted work is done:
`list_live` leaves it out (no reader gives it new work) unless asked to include it
(`pdserve status`, counts).
Every write stores the full hash, so a heartbeat after the key vanished (TTL lapse, Redis
restart) re-registers the instance; `heartbeat` reports that so the caller can republish.
"""

import logging

from redis.asyncio import Redis

from shared.cluster.decoding import as_text, as_text_dict
from shared.cluster.instance_records import (
    DRAINING,
    ROLES,
    SERVING,
    InstanceInfo,
    InstanceLoad,
    decode_instance,
    encode_instance,
    validate_role,
)
from shared.cluster.keys import ClusterNamespace, validate_name
from shared.errors import ConfigurationError, InternalError

__all__ = ["DRAINING", "ROLES", "SERVING", "InstanceInfo", "InstanceLoad", "InstanceRegistry"]

logger = logging.getLogger(__name__)


class InstanceRegistry:
    """Registers instances of one namespace in Redis and lists the live ones."""

    def __init__(self, redis: Redis, namespace: ClusterNamespace, ttl_s: float = 10.0):
        if not ttl_s > 0:
            raise ConfigurationError("ttl_s", f"must be > 0, got {ttl_s!r}")
        self.redis = redis
        self.namespace = namespace
        self.ttl_s = ttl_s
        # Instances registered through this registry, so heartbeats can re-register them.
        self._registered_infos: dict[str, InstanceInfo] = {}

    async def register(self, info: InstanceInfo, load: InstanceLoad | None = None) -> None:
        """Announce an instance (called once at instance startup, before heartbeats)."""
        if info.model != self.namespace.model:
            raise ConfigurationError(
                "model", f"{info.model!r} differs from namespace model {self.namespace.model!r}"
            )
        self._registered_infos[info.instance_id] = info
        await self._write(info, load or InstanceLoad())

    async def update_info(self, info: InstanceInfo, load: InstanceLoad) -> None:
        """A registered instance changed what it tells the cluster (the LoRA adapters it
        serves): write it now; heartbeats carry it from here on."""
        if info.instance_id not in self._registered_infos:
            raise InternalError(f"instance_id: {info.instance_id!r} was not registered through this registry")
        self._registered_infos[info.instance_id] = info
        await self._write(info, load)

    async def heartbeat(self, instance_id: str, load: InstanceLoad) -> bool:
        """Refresh TTL and load; return True if the key had vanished and was re-created."""
        info = self._registered_infos.get(instance_id)
        if info is None:
            raise InternalError(f"instance_id: {instance_id!r} was not registered through this registry")
        num_new_fields = await self._write(info, load)
        return num_new_fields > 0

    async def deregister(self, instance_id: str) -> None:
        """Remove an instance now (clean shutdown) instead of waiting for its TTL."""
        validate_name("instance_id", instance_id)
        self._registered_infos.pop(instance_id, None)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.namespace.instance(instance_id))
            pipe.srem(self.namespace.instances(), instance_id)
            await pipe.execute()

    async def list_live(
        self, role: str | None = None, include_draining: bool = False
    ) -> list[tuple[InstanceInfo, InstanceLoad]]:
        """Live instances (optionally of one role), sorted by instance id: those that take new
        work, and with `include_draining` also the draining ones."""
        if role is not None:
            validate_role(role)
        members = await self.redis.smembers(self.namespace.instances())
        instance_ids = sorted(as_text(member) for member in members)
        async with self.redis.pipeline(transaction=False) as pipe:
            for instance_id in instance_ids:
                pipe.hgetall(self.namespace.instance(instance_id))
            replies = await pipe.execute()
        live, vanished_ids = [], []
        for instance_id, reply in zip(instance_ids, replies):
            if not reply:
                vanished_ids.append(instance_id)
                continue
            record = self._decode_or_none(instance_id, as_text_dict(reply))
            if record is None or (role is not None and record[0].role != role):
                continue
            if include_draining or not record[0].is_draining:
                live.append(record)
        await self._forget_vanished(vanished_ids)
        return live

    async def server_run_id(self) -> str:
        """Redis's run id: it changes when the server restarts (state possibly lost)."""
        return as_text((await self.redis.info("server")).get("run_id", ""))

    async def live_instance_ids(self, role: str | None = None, include_draining: bool = False) -> set[str]:
        """Ids of live instances (what PrefixIndex.longest_prefix wants)."""
        return {info.instance_id for info, _ in await self.list_live(role, include_draining)}

    async def _write(self, info: InstanceInfo, load: InstanceLoad) -> int:
        """Store the full hash and TTL atomically; return how many fields were new."""
        key = self.namespace.instance(info.instance_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=encode_instance(info, load))
            pipe.pexpire(key, max(1, round(self.ttl_s * 1000)))
            pipe.sadd(self.namespace.instances(), info.instance_id)
            num_new_fields, _, _ = await pipe.execute()
        return num_new_fields

    async def _forget_vanished(self, instance_ids: list[str]) -> None:
        """Drop expired ids from the id set. A racing re-register is re-added by its next beat."""
        if instance_ids:
            await self.redis.srem(self.namespace.instances(), *instance_ids)

    @staticmethod
    def _decode_or_none(
        instance_id: str, hash_fields: dict[str, str]
    ) -> tuple[InstanceInfo, InstanceLoad] | None:
        try:
            return decode_instance(hash_fields)
        except (KeyError, ValueError) as error:
            logger.warning("skipping malformed instance record %s: %r", instance_id, error)
            return None
