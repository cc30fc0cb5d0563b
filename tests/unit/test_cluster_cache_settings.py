"""Cache settings in instance records: a round trip through a real Redis, records without
them (older instances), malformed ones skipped, bad values naming the field, and which
differences keep two instances from pairing."""

import asyncio
from dataclasses import replace

import pytest

from shared.cluster.cache_settings import cache_mismatches, decode_cache_settings, encode_cache_settings, hash_recipe
from shared.cluster.instance_records import decode_instance, encode_instance
from shared.cluster.instances import InstanceInfo, InstanceLoad, InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.engine_api.client import CacheSettings
from shared.errors import InvalidRequestError
from shared.kv_cache.block_hash import HashRecipe
from tests.helpers.redis_server import connect_async

MODEL = "smollm2"
NAMESPACE = ClusterNamespace("test", MODEL)
CACHE = CacheSettings(model_id="SmolLM2-135M-Instruct", block_size=32, prefix_hash_algo="blake2b",
                      dtype="float32", kv_layout="kv,layer,block,slot,kv_head,head_dim;layers=30;kv_heads=3;head_dim=64",
                      tensor_parallel_size=3)


def make_info(instance_id: str, cache: CacheSettings | None = CACHE) -> InstanceInfo:
    return InstanceInfo(instance_id, "decode", "127.0.0.1:5000", "127.0.0.1:7000", MODEL, cache=cache)


def test_registered_cache_settings_come_back_from_redis(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, NAMESPACE)
        await registry.register(make_info("d0"), InstanceLoad(0, 0, 5, 10))
        await registry.register(make_info("d1", cache=None))  # an instance of an older version
        stored = await client.hgetall(NAMESPACE.instance("d0"))
        assert stored[b"cache_block_size"] == b"32" and stored[b"cache_prefix_hash_algo"] == b"blake2b"
        assert await registry.list_live() == [(make_info("d0"), InstanceLoad(0, 0, 5, 10)),
                                              (make_info("d1", cache=None), InstanceLoad())]
        assert await registry.heartbeat("d0", InstanceLoad(1, 0, 5, 10)) is False  # nothing re-created
        assert (await registry.list_live())[0][0].cache == CACHE
        await client.aclose()

    asyncio.run(scenario())


def test_a_record_with_partial_or_bad_cache_settings_is_skipped(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, NAMESPACE)
        await registry.register(make_info("d0"))
        await registry.register(make_info("d1"))
        await registry.register(make_info("d2"))
        await client.hdel(NAMESPACE.instance("d0"), "cache_dtype")
        await client.hset(NAMESPACE.instance("d1"), "cache_prefix_hash_algo", "md5")
        assert [info.instance_id for info, _ in await registry.list_live()] == ["d2"]
        await client.aclose()

    asyncio.run(scenario())


def test_encoding_round_trips_without_redis():
    fields = encode_instance(make_info("d0"), InstanceLoad(1, 2, 3, 4))
    assert {name: value for name, value in fields.items() if name.startswith("cache_")} == encode_cache_settings(CACHE)
    assert decode_instance(fields) == (make_info("d0"), InstanceLoad(1, 2, 3, 4))
    assert decode_cache_settings({"role": "decode"}) is None


def test_a_record_of_an_older_release_counts_its_running_requests_as_prefilling():
    load = InstanceLoad(queue_depth=1, num_running_requests=5, num_free_blocks=3, num_total_blocks=4, num_prefilling=2)
    fields = encode_instance(make_info("d0"), load)
    assert decode_instance(fields)[1] == load
    del fields["num_prefilling"]  # written by a release without the field
    assert decode_instance(fields)[1].num_prefilling == 5


@pytest.mark.parametrize("field, change", [
    ("cache.block_size", {"block_size": 0}),
    ("cache.tensor_parallel_size", {"tensor_parallel_size": True}),
    ("cache.dtype", {"dtype": ""}),
    ("cache.model_id", {"model_id": None}),
    ("cache.prefix_hash_algo", {"prefix_hash_algo": "md5"}),
])
def test_bad_cache_settings_name_the_field(field, change):
    with pytest.raises(InvalidRequestError) as caught:
        make_info("d0", cache=replace(CACHE, **change))
    assert caught.value.field == field


def test_mismatches_name_each_differing_setting_except_tensor_parallel_size():
    assert cache_mismatches(CACHE, replace(CACHE, tensor_parallel_size=1)) == []
    assert cache_mismatches(CACHE, replace(CACHE, block_size=16, dtype="bfloat16")) == [
        "block_size 32 != 16", "dtype float32 != bfloat16"]
    assert cache_mismatches(CACHE, replace(CACHE, model_id="other")) == [
        "model_id SmolLM2-135M-Instruct != other"]
    assert cache_mismatches(CACHE, replace(CACHE, kv_layout="x")) == [f"kv_layout {CACHE.kv_layout} != x"]
    assert cache_mismatches(None, CACHE) == cache_mismatches(CACHE, None) == ["cache settings not registered"]
    assert hash_recipe(CACHE) == HashRecipe("SmolLM2-135M-Instruct", 32, "blake2b")
