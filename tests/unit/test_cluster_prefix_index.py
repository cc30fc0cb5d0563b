"""PrefixIndex against a real redis-server: exact longest-prefix counts, events, dead instances."""

import asyncio
import hashlib

import pytest

from shared.cluster.instances import InstanceInfo, InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.cluster.prefix_index import PrefixIndex
from shared.errors import InternalError, InvalidRequestError
from tests.helpers.redis_server import connect_async

NAMESPACE = ClusterNamespace("test", "smollm2")


def block_hash(index: int) -> bytes:
    return hashlib.sha256(f"block-{index}".encode()).digest()


PROMPT = [block_hash(i) for i in range(6)]  # the prompt's chained block hashes, in order


def run_with_index(redis_server, scenario) -> None:
    async def wrapper():
        client = connect_async(redis_server.url)
        try:
            await scenario(PrefixIndex(client, NAMESPACE), client)
        finally:
            await client.aclose()

    asyncio.run(wrapper())


def test_longest_prefix_counts_leading_blocks_per_live_instance(redis_server):
    async def scenario(index, _client):
        await index.add("a", PROMPT[:4])
        await index.add("b", PROMPT[:2] + PROMPT[3:6])  # hole at block 2
        await index.add("c", PROMPT[1:6])  # lacks the first block
        await index.add("d", PROMPT)
        await index.add("e", [block_hash(100)])  # unrelated prompt
        live = {"a", "b", "c", "d", "e", "f"}  # f is live but never indexed
        assert await index.longest_prefix(PROMPT, live) == {
            "a": 4, "b": 2, "c": 0, "d": 6, "e": 0, "f": 0}
        assert await index.longest_prefix(PROMPT[:3], {"a", "b"}) == {"a": 3, "b": 2}
        assert await index.longest_prefix([], {"a"}) == {"a": 0}
        assert await index.longest_prefix(PROMPT, []) == {}

    run_with_index(redis_server, scenario)


def test_evictions_replacements_and_drops_are_reflected(redis_server):
    async def scenario(index, _client):
        await index.add("a", PROMPT)
        await index.remove("a", [PROMPT[3]])
        assert await index.longest_prefix(PROMPT, {"a"}) == {"a": 3}
        await index.add("a", [PROMPT[3]])
        assert await index.longest_prefix(PROMPT, {"a"}) == {"a": 6}
        await index.replace_all("a", PROMPT[:2])
        assert await index.longest_prefix(PROMPT, {"a"}) == {"a": 2}
        await index.replace_all("a", [])
        assert await index.longest_prefix(PROMPT, {"a"}) == {"a": 0}
        await index.add("a", PROMPT)
        await index.drop_instance("a")
        assert await index.longest_prefix(PROMPT, {"a"}) == {"a": 0}
        assert await index.indexed_instance_ids() == set()

    run_with_index(redis_server, scenario)


def test_hashes_are_stored_as_raw_32_byte_members(redis_server):
    async def scenario(index, client):
        await index.add("a", PROMPT[:2])
        assert await client.smembers(NAMESPACE.prefix_held("a")) == set(PROMPT[:2])

    run_with_index(redis_server, scenario)


def test_dead_instances_are_ignored_and_garbage_collected(redis_server):
    async def scenario(index, client):
        registry = InstanceRegistry(client, NAMESPACE)
        await registry.register(InstanceInfo("alive", "prefill", "h:1", "", "smollm2"))
        await index.add("alive", PROMPT[:2])
        await index.add("dead", PROMPT)
        live_ids = await registry.live_instance_ids()
        assert await index.longest_prefix(PROMPT, live_ids) == {"alive": 2}
        assert await index.collect_garbage(live_ids) == ["dead"]
        assert await index.indexed_instance_ids() == {"alive"}
        assert await client.exists(NAMESPACE.prefix_held("dead")) == 0

    run_with_index(redis_server, scenario)


def test_garbage_collection_spares_instances_registered_after_the_live_list(redis_server):
    async def scenario(index, client):
        registry = InstanceRegistry(client, NAMESPACE)
        stale_live_ids = await registry.live_instance_ids()  # empty: nobody registered yet
        await registry.register(InstanceInfo("late", "decode", "h:2", "", "smollm2"))
        await index.add("late", PROMPT[:1])
        assert await index.collect_garbage(stale_live_ids) == []
        assert await index.longest_prefix(PROMPT, {"late"}) == {"late": 1}

    run_with_index(redis_server, scenario)


def test_namespaces_do_not_share_prefix_entries(redis_server):
    async def scenario(index, client):
        other = PrefixIndex(client, ClusterNamespace("other", "smollm2"))
        await index.add("a", PROMPT)
        assert await other.longest_prefix(PROMPT, {"a"}) == {"a": 0}
        assert await other.indexed_instance_ids() == set()

    run_with_index(redis_server, scenario)


def test_bad_hashes_and_ids_name_the_field(redis_server):
    async def scenario(index, _client):
        with pytest.raises(InternalError, match=r"^block_hashes: item 0 must be 32 bytes"):
            await index.add("a", [PROMPT[0].hex()])
        with pytest.raises(InvalidRequestError, match=r"^instance_id: must be"):
            await index.longest_prefix(PROMPT, {"a:b"})

    run_with_index(redis_server, scenario)
