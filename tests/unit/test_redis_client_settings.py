"""The Redis client's timeouts are settings (--redis-socket-timeout-s, --redis-connect-timeout-s,
--redis-retries, --redis-health-check-interval-s), of engine instances and gateways alike:
given as flags, they reach the client each builds, and they bound what a process cut from
Redis waits for (a gateway's routing read gives up and routes on its last listing)."""

import asyncio
import socket

import pytest

from services.instance.flags import parse_settings as parse_instance_settings
from services.instance.presence import ClusterPresence
from services.settings.redis_client import RedisClientSettings, redis_client
from services.gateway.server import cluster_view
from services.gateway.settings import parse_settings as parse_gateway_settings

FLAGS = ["--redis-socket-timeout-s", "0.7", "--redis-connect-timeout-s", "0.4", "--redis-retries", "0",
         "--redis-health-check-interval-s", "3"]
HANG_S = 60.0  # far beyond every timeout set here: only a wait the settings do not bound reaches it


def client_settings(client) -> tuple:
    kwargs = client.connection_pool.connection_kwargs
    return (kwargs["socket_timeout"], kwargs["socket_connect_timeout"], kwargs["retry"].get_retries(),
            kwargs["health_check_interval"])


def test_the_flags_reach_an_instances_redis_client_and_its_background_writes():
    settings = parse_instance_settings("pdserve-decode", ["decode"], FLAGS)
    presence = ClusterPresence(settings, "model")
    assert client_settings(presence.redis) == (0.7, 0.4, 0, 3.0)
    assert presence.op_timeout_s == presence.lease_mirror.op_timeout_s == 0.7


def test_the_flags_reach_the_gateways_redis_client_and_its_routing_reads():
    view = cluster_view(parse_gateway_settings(FLAGS), "model")
    assert client_settings(view.registry.redis) == (0.7, 0.4, 0, 3.0)
    assert view.redis_timeout_s == 0.7


def test_the_defaults_bound_every_command_and_retry_once():
    client = redis_client(RedisClientSettings(), "redis://127.0.0.1:6379/0")
    assert client_settings(client) == (2.0, 2.0, 1, 0.0)


@pytest.fixture
def unanswering_redis():
    """A port that accepts connections (the kernel's backlog) and never answers: Redis cut off."""
    listener = socket.create_server(("127.0.0.1", 0))
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    listener.close()


def test_a_gateway_whose_redis_does_not_answer_routes_on_its_last_listing(unanswering_redis):
    settings = parse_gateway_settings(["--redis-url", unanswering_redis, "--redis-socket-timeout-s", "0.2"])
    view = cluster_view(settings, "model")

    async def list_twice():
        return [await asyncio.wait_for(view.live(), HANG_S) for _ in range(2)]

    assert asyncio.run(list_twice()) == [[], []]  # nothing listed before: an empty last listing
    assert view.num_redis_errors == 2
