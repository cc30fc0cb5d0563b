"""Waiting for a child to be ready: its ready file, then the standard gRPC health check, then
(for an instance) its registration in Redis.

A service writes its ready file (JSON) once it has bound its listeners; the launcher reads
the bound gRPC address from it (`grpc_address`, or `address`, or `host` + `grpc_port`/`port`),
then polls grpc.health.v1.Health/Check until the service reports SERVING. An instance
registers in Redis in the background once SERVING, and a gateway routes only to what its
listing of Redis shows: an instance whose ready file names its namespace ("deployment",
"model") is ready once it is listed there, so that a first request after the stack's start
sees every instance (a gateway lists on its first request, never before).
"""

import asyncio
import time
from collections.abc import Callable

import redis.asyncio

from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from services.rpc.health_probe import is_serving
from services.rpc.ready_file import grpc_address_in, read_ready_file
from services.launcher.child import ChildProcess
from services.launcher.errors import StackAborted, StackError

POLL_INTERVAL_S = 0.1
# Longest one registry read waits for Redis (then: not registered yet, asked again).
REDIS_TIMEOUT_S = 2.0


def grpc_address_of(ready: dict, default_host: str = "127.0.0.1") -> str:
    """The bound gRPC address ("host:port") a ready file announces."""
    address = grpc_address_in(ready, default_host)
    if address is None:
        raise StackError(f"ready file has no gRPC address: {ready!r}")
    return address


def wait_until_ready(child: ChildProcess, deadline: float,
                     should_abort: Callable[[], bool]) -> dict:
    """Wait for `child`'s ready file; return its JSON. Raises StackError if the child exits."""
    while True:
        _check_alive(child, should_abort, "before writing its ready file")
        ready = read_ready_file(child.ready_file)
        if ready is not None:
            return ready
        if time.monotonic() > deadline:
            raise StackError(f"{child.name} wrote no ready file in time ({child.ready_file})")
        time.sleep(POLL_INTERVAL_S)


def wait_until_serving(child: ChildProcess, address: str, deadline: float,
                       should_abort: Callable[[], bool]) -> None:
    """Poll the health check of `child` at `address` until SERVING."""
    while True:
        _check_alive(child, should_abort, "before its health check reported SERVING")
        if is_serving(address):
            return
        if time.monotonic() > deadline:
            raise StackError(f"{child.name} at {address} was not SERVING in time")
        time.sleep(POLL_INTERVAL_S)


def wait_until_registered(child: ChildProcess, ready: dict, redis_url: str, deadline: float,
                          should_abort: Callable[[], bool]) -> None:
    """Poll Redis until the instance of `ready` is listed live in the namespace its ready file
    names; at once for a service that names none."""
    namespace = registered_namespace(ready)
    if namespace is None:
        return
    instance_id = ready.get("instance_id", child.name)
    while True:
        _check_alive(child, should_abort, "before it was registered in Redis")
        if instance_id in asyncio.run(_live_instance_ids(redis_url, namespace)):
            return
        if time.monotonic() > deadline:
            raise StackError(f"{child.name} was not registered in Redis ({namespace.prefix}) in time")
        time.sleep(POLL_INTERVAL_S)


def registered_namespace(ready: dict) -> ClusterNamespace | None:
    """The Redis namespace an instance's ready file says it registers in, if it names one."""
    deployment, model = ready.get("deployment"), ready.get("model")
    if not isinstance(deployment, str) or not isinstance(model, str):
        return None
    return ClusterNamespace(deployment, model)


async def _live_instance_ids(redis_url: str, namespace: ClusterNamespace) -> set[str]:
    """The ids listed live; none while Redis does not answer (it may be restarting)."""
    try:
        async with redis.asyncio.Redis.from_url(redis_url, socket_timeout=REDIS_TIMEOUT_S,
                                                socket_connect_timeout=REDIS_TIMEOUT_S) as client:
            return await InstanceRegistry(client, namespace).live_instance_ids()
    except (redis.RedisError, OSError):
        return set()


def _check_alive(child: ChildProcess, should_abort: Callable[[], bool], when: str) -> None:
    if should_abort():
        raise StackAborted(f"stop requested while waiting for {child.name}")
    code = child.exit_code()
    if code is not None:
        raise StackError(f"{child.name} exited with status {code} {when}; "
                         f"last log lines ({child.log_path}):\n{child.log_tail()}")
