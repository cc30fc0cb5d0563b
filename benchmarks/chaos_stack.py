"""The chaos benchmark's stack: Redis, 2 prefill + 2 decode instances and two gateways, all
supervised (a child that exits unasked is started again, as under `pdserve up`), plus what the
benchmark asks of it: which instances are registered, whether both gateways answer a probe, and
what the instances still hold once the load is over (blocks, reservations, requests)."""

import asyncio
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import redis.asyncio

from benchmarks.fault_load import greedy_request, random_prompt
from services.launcher import LocalStack, StackConfig
from services.launcher.child import stop_children
from services.launcher.supervisor import RestartPolicy
from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.model.default_model import resolve_model
from shared.pb.pdserve.v1 import gateway_pb2_grpc, instance_pb2, instance_pb2_grpc

SECOND_GATEWAY = "gateway-2"


class ChaosStack(LocalStack):
    """A LocalStack with a second gateway on the same Redis, supervised like the first."""

    def __init__(self, config: StackConfig):
        super().__init__(config)
        self.gateway_2 = None

    def start(self, should_abort=lambda: False) -> None:
        super().start(should_abort)
        try:
            self.gateway_2 = self.start_extra_gateway(SECOND_GATEWAY)
        except BaseException:
            self.stop()
            raise

    def children(self):
        return super().children() + ([self.gateway_2] if self.gateway_2 is not None else [])

    def stop(self) -> None:
        if self.gateway_2 is not None:
            stop_children([self.gateway_2], self.config.stop_grace_s)
        super().stop()

    @property
    def gateway_addresses(self) -> list[str]:
        return [self.addresses["gateway"], self.addresses[SECOND_GATEWAY]]


def chaos_config(dtype: str, run_dir: Path | None, gateway_args: list[str], instance_args: list[str]) -> StackConfig:
    """Ephemeral ports; heartbeats every 0.5 s (registration lapses 2 s after an instance stops)."""
    extra_args = {"instance": ["--heartbeat-interval-s", "0.5", "--heartbeat-ttl-s", "2", *instance_args],
                  "gateway": gateway_args}
    # The gateway's own flags travel through extra_args; each gateway gets an ephemeral port.
    return StackConfig(num_prefill=2, num_decode=2, model=str(resolve_model(None)), dtype=dtype, num_threads=1,
                       gateway_port=0, gateway_http_port=0, ready_timeout_s=600.0,
                       run_dir=run_dir or Path(tempfile.mkdtemp(prefix="bench-chaos-")), extra_args=extra_args,
                       restart_policy=RestartPolicy(initial_backoff_s=0.2, max_backoff_s=2.0))


def supervise_in_background(stack: LocalStack) -> threading.Event:
    stop_event = threading.Event()
    threading.Thread(target=stack.supervise, args=(stop_event,), daemon=True, name="supervisor").start()
    return stop_event


def registered_ids(stack: LocalStack) -> set[str]:
    namespace = ClusterNamespace(stack.config.deployment, Path(stack.config.model).name)

    async def read() -> set[str]:
        async with redis.asyncio.Redis.from_url(stack.redis_url, socket_timeout=1, socket_connect_timeout=1) as client:
            return await InstanceRegistry(client, namespace).live_instance_ids()
    try:
        return asyncio.run(read())
    except (OSError, redis.RedisError, asyncio.TimeoutError):
        return set()


def probe(address: str, seed: int, timeout_s: float = 30.0) -> bool:
    """One short greedy request through this gateway completes."""
    request = greedy_request(random_prompt(24, seed), 4)
    try:
        with grpc.insecure_channel(address) as channel:
            messages = list(gateway_pb2_grpc.GatewayStub(channel).Generate(request, timeout=timeout_s))
    except grpc.RpcError:
        return False
    return bool(messages) and messages[-1].finish_reason != 0


def wait_healthy(stack: ChaosStack, seed: int, timeout_s: float) -> float:
    """Seconds until every instance is registered and a probe through each gateway completes
    (nan if not within `timeout_s`)."""
    started = time.monotonic()
    names = {child.name for child in stack.instances}
    while time.monotonic() - started < timeout_s:
        if registered_ids(stack) == names and all(probe(a, seed) for a in stack.gateway_addresses):
            return time.monotonic() - started
        time.sleep(0.2)
    return float("nan")


@dataclass
class Leftovers:
    """What live instances still hold once the load is over (every field 0 when nothing leaked)."""

    held_blocks: int = 0
    reservations: int = 0
    requests: int = 0  # waiting or running
    unreachable: int = 0  # instances that did not answer GetStatus

    @property
    def is_clean(self) -> bool:
        return not (self.held_blocks or self.reservations or self.requests or self.unreachable)


def leftovers(stack: LocalStack) -> Leftovers:
    found = Leftovers()
    for child in stack.instances:
        try:
            with grpc.insecure_channel(stack.addresses[child.name]) as channel:
                status = instance_pb2_grpc.InstanceStub(channel).GetStatus(instance_pb2.StatusRequest(), timeout=10)
        except (grpc.RpcError, KeyError):
            found.unreachable += 1
            continue
        found.held_blocks += status.num_total_blocks - status.num_free_blocks
        found.reservations += status.num_reserved
        found.requests += status.num_waiting + status.num_running
    return found


def wait_leftovers(stack: LocalStack, timeout_s: float = 90.0) -> Leftovers:
    """Releases and lease expiries are asynchronous: the first clean reading within `timeout_s`,
    else the last one."""
    deadline = time.monotonic() + timeout_s
    while not (found := leftovers(stack)).is_clean and time.monotonic() < deadline:
        time.sleep(0.5)
    return found
