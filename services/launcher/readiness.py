"""Waiting for a child to be ready: its ready file, then the standard gRPC health check.

A service writes its ready file (JSON) once it has bound its listeners; the launcher reads
the bound gRPC address from it (`grpc_address`, or `address`, or `host` + `grpc_port`/`port`),
then polls grpc.health.v1.Health/Check until the service reports SERVING.
"""

import json
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.launcher.child import ChildProcess
from services.launcher.errors import StackAborted, StackError

POLL_INTERVAL_S = 0.1


def read_ready_file(path: Path) -> dict | None:
    """The ready file's JSON object, or None while it is missing or half-written."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def grpc_address_of(ready: dict, default_host: str = "127.0.0.1") -> str:
    """The bound gRPC address ("host:port") a ready file announces."""
    for key in ("grpc_address", "address"):
        if isinstance(ready.get(key), str) and ready[key]:
            return ready[key]
    for key in ("grpc_port", "port"):
        if isinstance(ready.get(key), int) and ready[key] > 0:
            return f"{ready.get('host') or default_host}:{ready[key]}"
    raise StackError(f"ready file has no gRPC address: {ready!r}")


def health_status(address: str, service: str = "", timeout_s: float = 1.0,
                  credentials: grpc.ChannelCredentials | None = None) -> int | None:
    """The health service's status for `service`, or None when unreachable/unimplemented.
    With `credentials`, over TLS."""
    channel = grpc.insecure_channel(address) if credentials is None else grpc.secure_channel(address, credentials)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError:
            return None
    return reply.status


def is_serving(address: str, service: str = "", timeout_s: float = 1.0,
               credentials: grpc.ChannelCredentials | None = None) -> bool:
    return health_status(address, service, timeout_s, credentials) == health_pb2.HealthCheckResponse.SERVING


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


def _check_alive(child: ChildProcess, should_abort: Callable[[], bool], when: str) -> None:
    if should_abort():
        raise StackAborted(f"stop requested while waiting for {child.name}")
    code = child.exit_code()
    if code is not None:
        raise StackError(f"{child.name} exited with status {code} {when}; "
                         f"last log lines ({child.log_path}):\n{child.log_tail()}")
