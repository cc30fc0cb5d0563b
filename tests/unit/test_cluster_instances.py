"""InstanceRegistry against a real redis-server: registration, load, TTL, isolation."""

import asyncio
import dataclasses

import pytest

from shared.cluster.instances import DRAINING, InstanceInfo, InstanceLoad, InstanceRegistry
from shared.cluster.instance_records import decode_instance, encode_instance
from shared.cluster.keys import ClusterNamespace
from shared.errors import ConfigurationError, InternalError, InvalidRequestError
from tests.helpers.redis_server import connect_async

MODEL = "smollm2"
NAMESPACE = ClusterNamespace("test", MODEL)


def make_info(instance_id: str, role: str = "prefill") -> InstanceInfo:
    return InstanceInfo(instance_id, role, f"127.0.0.1:{len(instance_id) + 5000}",
                        "ucx://127.0.0.1:7000", MODEL)


def test_registered_instances_are_listed_with_their_load(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, NAMESPACE, ttl_s=10.0)
        await registry.register(make_info("p0"), InstanceLoad(2, 1, 90, 100))
        await registry.register(make_info("d0", "decode"))
        assert await registry.list_live() == [
            (make_info("d0", "decode"), InstanceLoad(0, 0, 0, 0)),
            (make_info("p0"), InstanceLoad(2, 1, 90, 100)),
        ]
        assert await registry.list_live(role="prefill") == [
            (make_info("p0"), InstanceLoad(2, 1, 90, 100))]
        assert await registry.live_instance_ids(role="decode") == {"d0"}
        assert await registry.heartbeat("p0", InstanceLoad(0, 3, 50, 100)) is False
        assert await registry.list_live(role="prefill") == [
            (make_info("p0"), InstanceLoad(0, 3, 50, 100))]
        await registry.deregister("p0")
        assert await registry.live_instance_ids() == {"d0"}
        await client.aclose()

    asyncio.run(scenario())


def test_instance_that_stops_heartbeating_expires_after_its_ttl(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, NAMESPACE, ttl_s=0.5)
        await registry.register(make_info("p0"))
        await registry.register(make_info("p1"))
        await asyncio.sleep(0.3)
        await registry.heartbeat("p1", InstanceLoad())  # p1 beats, p0 does not
        await asyncio.sleep(0.35)
        assert await registry.live_instance_ids() == {"p1"}
        assert await client.smembers(NAMESPACE.instances()) == {b"p1"}  # stale id pruned
        await client.aclose()

    asyncio.run(scenario())


def test_heartbeat_after_key_vanished_re_registers_and_says_so(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, NAMESPACE, ttl_s=10.0)
        await registry.register(make_info("p0"))
        await client.flushall()  # what an empty restarted Redis looks like
        assert await registry.heartbeat("p0", InstanceLoad(1, 0, 0, 0)) is True
        assert await registry.list_live() == [(make_info("p0"), InstanceLoad(1, 0, 0, 0))]
        assert await registry.heartbeat("p0", InstanceLoad(1, 0, 0, 0)) is False
        await client.aclose()

    asyncio.run(scenario())


def test_a_draining_instance_stays_registered_but_is_listed_only_when_asked(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, NAMESPACE, ttl_s=10.0)
        await registry.register(make_info("d0", "decode"))
        await registry.register(make_info("d1", "decode"))
        draining = dataclasses.replace(make_info("d1", "decode"), state=DRAINING)
        await registry.update_info(draining, InstanceLoad(0, 2, 5, 10))
        assert await registry.live_instance_ids() == {"d0"}  # what routing and the planner read
        assert await registry.list_live("decode", include_draining=True) == [
            (make_info("d0", "decode"), InstanceLoad()), (draining, InstanceLoad(0, 2, 5, 10))]
        assert await registry.heartbeat("d1", InstanceLoad(0, 1, 6, 10)) is False  # beats keep the state
        assert await registry.live_instance_ids(include_draining=True) == {"d0", "d1"}
        assert (await registry.list_live(include_draining=True))[1][0].is_draining
        await registry.deregister("d1")  # its work done
        assert await registry.live_instance_ids(include_draining=True) == {"d0"}
        await client.aclose()

    asyncio.run(scenario())


def test_a_record_without_a_state_reads_as_serving():
    fields = encode_instance(make_info("p0"), InstanceLoad())
    del fields["state"]  # an instance of an older release
    assert decode_instance(fields)[0].state == "serving"


def test_two_deployments_sharing_one_redis_do_not_see_each_other(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        blue = InstanceRegistry(client, ClusterNamespace("blue", MODEL))
        green = InstanceRegistry(client, ClusterNamespace("green", MODEL))
        await blue.register(make_info("p0"))
        await green.register(make_info("p9"))
        assert await blue.live_instance_ids() == {"p0"}
        assert await green.live_instance_ids() == {"p9"}
        await client.aclose()

    asyncio.run(scenario())


def test_bad_registry_calls_name_the_field(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, NAMESPACE)
        with pytest.raises(InternalError, match=r"^instance_id: 'ghost' was not"):
            await registry.heartbeat("ghost", InstanceLoad())
        other_model = InstanceInfo("p0", "prefill", "127.0.0.1:1", "", "llama")
        with pytest.raises(ConfigurationError, match=r"^model: 'llama' differs"):
            await registry.register(other_model)
        with pytest.raises(InvalidRequestError, match=r"^role: must be one of"):
            await registry.list_live(role="router")
        await client.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("field, make", [
    ("role", lambda: InstanceInfo("p0", "router", "127.0.0.1:1", "", MODEL)),
    ("instance_id", lambda: InstanceInfo("p:0", "prefill", "127.0.0.1:1", "", MODEL)),
    ("grpc_address", lambda: InstanceInfo("p0", "prefill", "", "", MODEL)),
    ("state", lambda: InstanceInfo("p0", "prefill", "127.0.0.1:1", "", MODEL, state="stopping")),
    ("queue_depth", lambda: InstanceLoad(queue_depth=-1)),
    ("num_running_requests", lambda: InstanceLoad(num_running_requests=True)),
    ("num_free_blocks", lambda: InstanceLoad(num_free_blocks=11, num_total_blocks=10)),
])
def test_invalid_instance_records_name_the_field(field, make):
    with pytest.raises(InvalidRequestError) as caught:
        make()
    assert caught.value.field == field
