"""Each instance's KV tier counters in Redis, for `pdserve status` (one hash per instance,
`kv_tiers:{instance_id}`: tier -> JSON of its KVTierStats, refreshed with a TTL like the
registration, so a dead instance's entry lapses)."""

import json
from collections.abc import Iterable
from dataclasses import asdict, fields

from redis.asyncio import Redis

from shared.cluster.decoding import as_text_dict
from shared.cluster.keys import ClusterNamespace, validate_name
from shared.kv_tier.stats import KVTierStats

_FIELDS = {f.name for f in fields(KVTierStats)}


class TierBoard:
    def __init__(self, redis: Redis, namespace: ClusterNamespace, ttl_s: float):
        self.redis = redis
        self.namespace = namespace
        self.ttl_s = ttl_s

    async def write(self, instance_id: str, tiers: Iterable[KVTierStats]) -> None:
        validate_name("instance_id", instance_id)
        mapping = {tier.tier: json.dumps(asdict(tier)) for tier in tiers}
        if not mapping:
            return
        key = self.namespace.kv_tiers(instance_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=mapping)
            pipe.pexpire(key, max(1, round(self.ttl_s * 1000)))
            await pipe.execute()

    async def read(self, instance_ids: Iterable[str]) -> dict[str, list[KVTierStats]]:
        instance_ids = sorted(validate_name("instance_id", i) for i in instance_ids)
        async with self.redis.pipeline(transaction=False) as pipe:
            for instance_id in instance_ids:
                pipe.hgetall(self.namespace.kv_tiers(instance_id))
            replies = await pipe.execute()
        return {instance_id: [_decode(value) for _, value in sorted(as_text_dict(reply).items())]
                for instance_id, reply in zip(instance_ids, replies) if reply}


def _decode(value: str) -> KVTierStats:
    raw = json.loads(value)
    return KVTierStats(**{name: raw[name] for name in _FIELDS if name in raw})
