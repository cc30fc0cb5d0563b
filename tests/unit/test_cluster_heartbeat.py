"""Heartbeater against a real redis-server: keeps alive, survives outages, stops cleanly."""

import asyncio
import inspect
from collections.abc import Awaitable, Callable

from shared.cluster.heartbeat import Heartbeater
from shared.cluster.instances import InstanceInfo, InstanceLoad, InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from tests.helpers.redis_server import connect_async

NAMESPACE = ClusterNamespace("test", "smollm2")
INFO = InstanceInfo("d0", "decode", "127.0.0.1:5001", "ucx://127.0.0.1:7001", "smollm2")


async def wait_until(condition: Callable[[], bool | Awaitable[bool]],
                     timeout_s: float = 5.0) -> None:
    """Poll condition (sync or async) until true; fail the test after timeout_s."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await _resolve(condition()):
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def make_heartbeater(registry, on_reconnect=None, load=InstanceLoad(0, 1, 10, 16)):
    return Heartbeater(registry, INFO, lambda: load, interval_s=0.1, on_reconnect=on_reconnect,
                       max_backoff_s=0.2, beat_timeout_s=1.0)


def test_heartbeats_keep_instance_alive_past_ttl_and_stop_deregisters(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, NAMESPACE, ttl_s=0.5)
        beater = make_heartbeater(registry)
        beater.start()
        await asyncio.sleep(1.2)  # more than two TTLs
        assert await registry.list_live() == [(INFO, InstanceLoad(0, 1, 10, 16))]
        await beater.stop()
        assert await registry.list_live() == []
        assert (beater.num_failed_beats, beater.num_reconnects) == (0, 0)
        await client.aclose()

    asyncio.run(scenario())


def test_heartbeater_survives_redis_restart_then_re_registers_and_calls_on_reconnect(
        redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, NAMESPACE, ttl_s=1.0)
        republish_calls = []

        async def republish():
            republish_calls.append(await registry.live_instance_ids())

        beater = make_heartbeater(registry, on_reconnect=republish)
        beater.start()
        await wait_until(lambda: _is_live(registry))
        redis_server.stop()
        await wait_until(lambda: beater.num_failed_beats >= 2)
        redis_server.start()  # same port, empty
        await wait_until(lambda: beater.num_reconnects == 1)
        assert republish_calls == [{"d0"}]  # re-registered before on_reconnect ran
        await beater.stop()
        assert await registry.list_live() == []
        await client.aclose()

    asyncio.run(scenario())


def test_immediate_redis_restart_on_same_port_is_detected_and_repaired(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, NAMESPACE, ttl_s=1.0)
        republish_calls = []

        async def republish():
            republish_calls.append(await registry.live_instance_ids())

        beater = make_heartbeater(registry, on_reconnect=republish)
        beater.start()
        await wait_until(lambda: _is_live(registry))
        port = redis_server.port
        redis_server.restart()
        assert redis_server.port == port
        await wait_until(lambda: beater.num_reconnects == 1)
        assert republish_calls == [{"d0"}]
        await beater.stop()
        await client.aclose()

    asyncio.run(scenario())


def test_key_lost_without_any_failed_beat_still_triggers_on_reconnect(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, NAMESPACE, ttl_s=1.0)
        republish_calls = []

        async def republish():
            republish_calls.append("republished")

        beater = make_heartbeater(registry, on_reconnect=republish)
        beater.start()
        await wait_until(lambda: _is_live(registry))
        await client.flushall()
        await wait_until(lambda: beater.num_reconnects == 1)
        assert republish_calls == ["republished"]
        assert await _is_live(registry)
        assert beater.num_failed_beats == 0
        await beater.stop()
        await client.aclose()

    asyncio.run(scenario())


def test_failing_on_reconnect_is_retried_until_it_succeeds(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, NAMESPACE, ttl_s=1.0)
        attempts = []

        async def flaky_republish():
            attempts.append(len(attempts))
            if len(attempts) < 3:
                raise ConnectionError("index write failed")

        beater = make_heartbeater(registry, on_reconnect=flaky_republish)
        beater.start()
        await wait_until(lambda: _is_live(registry))
        await client.flushall()
        await wait_until(lambda: beater.num_reconnects == 1)
        assert attempts == [0, 1, 2]
        assert beater.num_failed_beats == 2
        await beater.stop()
        await client.aclose()

    asyncio.run(scenario())


def test_stop_while_redis_is_down_returns_without_raising(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        beater = make_heartbeater(InstanceRegistry(client, NAMESPACE, ttl_s=1.0))
        beater.start()
        await asyncio.sleep(0.2)
        redis_server.stop()
        await asyncio.sleep(0.2)
        await asyncio.wait_for(beater.stop(), timeout=3.0)
        await client.aclose()

    asyncio.run(scenario())


async def _is_live(registry: InstanceRegistry) -> bool:
    return await registry.live_instance_ids() == {"d0"}


async def _resolve(value: bool | Awaitable[bool]) -> bool:
    return await value if inspect.isawaitable(value) else value
