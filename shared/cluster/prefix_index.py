"""Prefix index: which instances hold which KV blocks, for longest-cached-prefix routing.

Each instance owns one Redis set of the raw 32-byte block hashes it holds
(`prefix:held:{instance_id}`); each host's KV tiers have one too (`prefix:tier:{tier_id}`,
written by every instance of the host for the blocks it stored there or evicted from there:
`update_tier`, `replace_tier`). The instance keeps its own set true with events: `add` when it
stores a block, `remove` when it evicts one, `replace_all` to republish everything after a
Redis reconnect, `drop_instance` at shutdown. Gateways call `longest_prefix` with a
prompt's chained block hashes and the live instance ids: one pipelined SMISMEMBER per live
instance, so one round trip however many instances and blocks. Sets of instances that are
no longer live are ignored there, and `collect_garbage` deletes them once unregistered.
"""

from collections.abc import Iterable, Iterator

from redis.asyncio import Redis

from shared.cluster.decoding import as_text
from shared.cluster.keys import ClusterNamespace, validate_block_hashes, validate_name

# Hashes per SADD/SREM command, so one huge republish doesn't become one giant command.
MAX_HASHES_PER_COMMAND = 10_000


# KEYS = [indexed set, then per candidate: its instance key, its held set]; ARGV = ids.
_DROP_IF_UNREGISTERED_LUA = """
local dropped = {}
for i, instance_id in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[2 * i]) == 0 then
    redis.call('DEL', KEYS[2 * i + 1])
    redis.call('SREM', KEYS[1], instance_id)
    table.insert(dropped, instance_id)
  end
end
return dropped
"""


def _chunks(block_hashes: list[bytes]) -> Iterator[list[bytes]]:
    for start in range(0, len(block_hashes), MAX_HASHES_PER_COMMAND):
        yield block_hashes[start : start + MAX_HASHES_PER_COMMAND]


def _set_exactly(pipe, key: str, block_hashes: list[bytes]) -> None:
    """Queue on `pipe` the commands that make the Redis set `key` exactly these hashes."""
    pipe.delete(key)
    for chunk in _chunks(block_hashes):
        pipe.sadd(key, *chunk)


def _num_leading_ones(flags: list[int]) -> int:
    for index, flag in enumerate(flags):
        if not flag:
            return index
    return len(flags)


class PrefixIndex:
    """Block-hash -> instance index of one namespace."""

    def __init__(self, redis: Redis, namespace: ClusterNamespace):
        self.redis = redis
        self.namespace = namespace

    async def add(self, instance_id: str, block_hashes: Iterable[bytes]) -> None:
        """Record that the instance now holds these blocks."""
        validate_name("instance_id", instance_id)
        hashes = validate_block_hashes(block_hashes)
        if not hashes:
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            for chunk in _chunks(hashes):
                pipe.sadd(self.namespace.prefix_held(instance_id), *chunk)
            pipe.sadd(self.namespace.prefix_indexed(), instance_id)
            await pipe.execute()

    async def remove(self, instance_id: str, block_hashes: Iterable[bytes]) -> None:
        """Record that the instance evicted these blocks."""
        validate_name("instance_id", instance_id)
        hashes = validate_block_hashes(block_hashes)
        if not hashes:
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            for chunk in _chunks(hashes):
                pipe.srem(self.namespace.prefix_held(instance_id), *chunk)
            await pipe.execute()

    async def replace_all(self, instance_id: str, block_hashes: Iterable[bytes]) -> None:
        """Make the instance's entry exactly these blocks, atomically (republish)."""
        validate_name("instance_id", instance_id)
        hashes = validate_block_hashes(block_hashes)
        async with self.redis.pipeline(transaction=True) as pipe:
            _set_exactly(pipe, self.namespace.prefix_held(instance_id), hashes)
            pipe.sadd(self.namespace.prefix_indexed(), instance_id)
            await pipe.execute()

    async def drop_instance(self, instance_id: str) -> None:
        """Forget everything the instance held (shutdown, or found dead)."""
        validate_name("instance_id", instance_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.namespace.prefix_held(instance_id))
            pipe.srem(self.namespace.prefix_indexed(), instance_id)
            await pipe.execute()

    async def longest_prefix(
        self, block_hashes: Iterable[bytes], live_instance_ids: Iterable[str]
    ) -> dict[str, int]:
        """For every live instance: how many leading blocks of the prompt it holds (0 too)."""
        instance_ids = sorted({validate_name("instance_id", i) for i in live_instance_ids})
        return await self._leading_runs(block_hashes, {i: self.namespace.prefix_held(i) for i in instance_ids})

    async def longest_tier_prefix(self, block_hashes: Iterable[bytes], tier_ids: Iterable[str]) -> dict[str, int]:
        """For every host tier: how many leading blocks of the prompt it holds (0 too)."""
        tier_ids = sorted({validate_name("tier_id", t) for t in tier_ids})
        return await self._leading_runs(block_hashes, {t: self.namespace.prefix_tier(t) for t in tier_ids})

    async def _leading_runs(self, block_hashes: Iterable[bytes], keys: dict[str, str]) -> dict[str, int]:
        """One pipelined SMISMEMBER per set: the leading blocks each holds."""
        hashes = validate_block_hashes(block_hashes)
        if not hashes or not keys:
            return dict.fromkeys(keys, 0)
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys.values():
                pipe.smismember(key, hashes)
            replies = await pipe.execute()
        return {name: _num_leading_ones(flags) for name, flags in zip(keys, replies)}

    async def update_tier(self, tier_id: str, stored: Iterable[bytes], removed: Iterable[bytes]) -> None:
        """Record blocks a host tier gained and lost (through one of its instances)."""
        validate_name("tier_id", tier_id)
        stored, removed = validate_block_hashes(stored), validate_block_hashes(removed)
        if not stored and not removed:
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            for chunk in _chunks(removed):
                pipe.srem(self.namespace.prefix_tier(tier_id), *chunk)
            for chunk in _chunks(stored):
                pipe.sadd(self.namespace.prefix_tier(tier_id), *chunk)
            await pipe.execute()

    async def replace_tier(self, tier_id: str, block_hashes: Iterable[bytes]) -> None:
        """Make a host tier's entry exactly these blocks (republish)."""
        validate_name("tier_id", tier_id)
        hashes = validate_block_hashes(block_hashes)
        async with self.redis.pipeline(transaction=True) as pipe:
            _set_exactly(pipe, self.namespace.prefix_tier(tier_id), hashes)
            await pipe.execute()

    async def indexed_instance_ids(self) -> set[str]:
        """Instances that have (or had) an entry, live or not."""
        members = await self.redis.smembers(self.namespace.prefix_indexed())
        return {as_text(member) for member in members}

    async def collect_garbage(self, live_instance_ids: Iterable[str]) -> list[str]:
        """Drop entries of dead instances; return their sorted ids.

        Candidates are indexed instances missing from live_instance_ids; each is dropped only
        if its registry key is also absent at that moment (checked atomically in Redis), so
        an instance that registered after the caller listed live ids keeps its entry.
        """
        live_ids = {validate_name("instance_id", i) for i in live_instance_ids}
        candidate_ids = sorted(await self.indexed_instance_ids() - live_ids)
        if not candidate_ids:
            return []
        keys = [self.namespace.prefix_indexed()]
        for instance_id in candidate_ids:
            keys += [self.namespace.instance(instance_id), self.namespace.prefix_held(instance_id)]
        dropped = await self.redis.eval(
            _DROP_IF_UNREGISTERED_LUA, len(keys), *keys, *candidate_ids
        )
        return sorted(as_text(instance_id) for instance_id in dropped)
