"""The gateway prefers instances that hold a request's LoRA adapter in memory (a real Redis).

Instances register the adapters they serve (InstanceInfo.lora_adapters) and, with every
heartbeat, the ones their model runner holds in memory now (InstanceLoad.resident_lora_adapters).
Among the instances that serve the adapter, ranking is: prefix blocks held first (a hit saves
computing blocks), then the adapter in memory (it saves reading the adapter's files), then
load. A base-model request ignores residency.
"""

import asyncio

import redis.asyncio

from services.gateway.cluster_view import ClusterView
from services.gateway.prompt_hashes import PromptHashes
from services.gateway.router import rank
from services.instance.presence import instance_load
from shared.cluster.cache_settings import hash_recipe
from shared.cluster.instance_records import InstanceInfo, InstanceLoad, decode_instance, encode_instance
from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.cluster.prefix_index import PrefixIndex
from shared.engine_api.client import EngineLoad
from tests.unit.gateway_fakes import FAKE_BLOCK_SIZE, fake_cache_settings

MODEL = "tiny"
SQL = {"sql": "lora:sql:00aa", "chat": "lora:chat:00bb"}
PROMPT = list(range(3 * FAKE_BLOCK_SIZE))


def decode(instance_id: str) -> InstanceInfo:
    return InstanceInfo(instance_id, "decode", f"{instance_id}:1", f"ucx-{instance_id}", MODEL,
                        cache=fake_cache_settings(MODEL), lora_adapters=tuple(sorted(SQL.items())))


def load(free_blocks: int, *resident: str) -> InstanceLoad:
    return InstanceLoad(0, 0, free_blocks, 100, resident_lora_adapters=tuple(sorted(resident)))


def test_resident_adapters_travel_with_the_load_and_older_records_have_none():
    record, with_two = decode("d0"), load(5, "chat", "sql")
    assert decode_instance(encode_instance(record, with_two)) == (record, with_two)
    older = {k: v for k, v in encode_instance(record, with_two).items() if k != "resident_lora_adapters"}
    assert decode_instance(older)[1].resident_lora_adapters == ()
    engine = EngineLoad(1, 2, 0, 5, 100, resident_lora_adapters=("sql",))
    assert instance_load(_FakeEngine(engine)).resident_lora_adapters == ("sql",)


class _FakeEngine:
    def __init__(self, engine_load: EngineLoad):
        self._load = engine_load

    def load(self) -> EngineLoad:
        return self._load


def test_an_adapter_request_goes_first_to_an_instance_holding_it_unless_another_holds_its_prefix(redis_server):
    async def scenario():
        client = redis.asyncio.Redis.from_url(redis_server.url)
        namespace = ClusterNamespace("test", MODEL)
        registry, index = InstanceRegistry(client, namespace), PrefixIndex(client, namespace)
        view = ClusterView(registry, index, cache_s=0.0)
        # d0 has the most room; d2 holds sql in memory; d1 holds only chat.
        await registry.register(decode("d0"), load(90))
        await registry.register(decode("d1"), load(50, "chat"))
        await registry.register(decode("d2"), load(10, "sql"))

        async def ranked(adapter: str | None) -> tuple[list[str], str]:
            choice = rank(await view.candidates(PromptHashes(PROMPT, None, adapter=adapter)), "decode")
            return [c.instance_id for c in choice.ranked], choice.reason

        assert await ranked("sql") == (["d2", "d0", "d1"], "adapter")
        assert await ranked("chat") == (["d1", "d0", "d2"], "adapter")
        assert await ranked(None) == (["d0", "d1", "d2"], "load")
        # d0 holds the first two blocks of the prompt as hashed for sql: the prefix wins.
        hashes = PromptHashes(PROMPT, None, adapter="sql")
        hashes.adapter_key = SQL["sql"]
        await index.add("d0", hashes.for_recipe(hash_recipe(fake_cache_settings(MODEL)))[:2])
        assert await ranked("sql") == (["d0", "d2", "d1"], "prefix")
        # A heartbeat: d1 now holds sql as well; between the two holders load decides.
        await registry.heartbeat("d1", load(50, "chat", "sql"))
        await index.drop_instance("d0")
        assert await ranked("sql") == (["d1", "d2", "d0"], "load")
        await client.aclose()
    asyncio.run(scenario())
