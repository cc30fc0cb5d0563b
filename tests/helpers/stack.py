"""A real pdserve stack for end-to-end tests, built on services.launcher.

`start_test_stack(model_folder, dtype)` starts redis-server, 2 prefill and 2 decode
instances (or what the caller asks for) and one gateway as separate OS processes, every
listener on an ephemeral loopback port, and waits until all are SERVING. The returned
StackHarness gives the tests gRPC stubs, GetStatus per instance, SIGKILL of one instance,
a Redis restart on the same port, registry/prefix-index views, and the "no stranded blocks"
check every test ends with.
"""

import asyncio
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import redis.asyncio

from services.launcher import LocalStack, StackConfig
from services.launcher.child import ChildProcess, stop_children
from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.cluster.prefix_index import PrefixIndex
from shared.kv_cache.block_hash import hash_full_blocks
from shared.pb.pdserve.v1 import gateway_pb2_grpc, instance_pb2, instance_pb2_grpc

DEPLOYMENT = "default"
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Instance:
    """One engine instance of the stack: its name (= instance id), role and gRPC address."""

    name: str
    role: str
    address: str
    child: ChildProcess

    @property
    def pid(self) -> int | None:
        return self.child.pid

    def is_running(self) -> bool:
        return self.child.is_running()


class StackHarness:
    def __init__(self, stack: LocalStack, model_folder: Path):
        self.stack = stack
        self.model_folder = Path(model_folder)
        self.namespace = ClusterNamespace(DEPLOYMENT, self.model_folder.name)
        self._channels: dict[str, grpc.Channel] = {}

    # ---- processes -----------------------------------------------------------------------

    def instances(self, role: str | None = None, live_only: bool = True) -> list[Instance]:
        found = []
        for child in self.stack.instances:
            if (role is None or child.role == role) and (child.is_running() or not live_only):
                found.append(Instance(child.name, child.role, self.stack.addresses[child.name], child))
        return found

    def instance(self, name: str) -> Instance:
        for instance in self.instances(live_only=False):
            if instance.name == name:
                return instance
        raise KeyError(name)

    def kill(self, instance: Instance, signum: int = signal.SIGKILL) -> None:
        """Signal one instance (default SIGKILL: no deregistration) and wait for its exit."""
        instance.child.expected_exit = True
        instance.child.send_signal(signum)
        assert instance.child.wait(30.0), f"{instance.name} did not exit after {signum}"
        channel = self._channels.pop(instance.address, None)
        if channel is not None:
            channel.close()

    def restart_redis(self, down_s: float = 0.5) -> None:
        """Redis goes away and comes back empty on the same port (no persistence)."""
        self.stack.redis.restart(down_s=down_s)

    def stop_redis(self) -> None:
        stop_children([self.stack.redis], grace_s=10.0)

    def start_redis(self) -> None:
        """Start it again, empty, on the same port."""
        self.stack.redis.start()
        self.stack.redis.wait_ready()

    def add_instance(self, name: str, role: str) -> Instance:
        """Start one more instance (e.g. to replace a killed one) and wait until SERVING."""
        deadline = time.monotonic() + self.stack.config.ready_timeout_s
        [child] = self.stack.start_instances([(name, role)], deadline)
        return self.instance(child.name)

    def ensure_live(self, counts: dict[str, int], timeout_s: float = 30.0) -> None:
        """Start replacements (new names) until `counts[role]` instances of each role run, then
        wait until exactly the live ones are registered: a stack shared by modules that kill
        instances is back at full strength before each test."""
        for role, count in counts.items():
            index = len(self.instances(role, live_only=False))
            while len(self.instances(role)) < count:
                self.add_instance(f"{role}-{index}", role)
                index += 1
        names = {instance.name for instance in self.instances()}
        self.wait_for(lambda: self.registered_ids() == names, timeout_s, "every live instance registered")

    def check_children_alive(self) -> None:
        dead = self.stack.find_dead_child()
        assert dead is None, (f"{dead.name} died with status {dead.exit_code()}; log tail "
                              f"({dead.log_path}):\n{dead.log_tail(40)}")

    def stop(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self.stack.stop()

    # ---- gRPC ----------------------------------------------------------------------------

    def channel(self, address: str) -> grpc.Channel:
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        return self._channels[address]

    @property
    def gateway(self) -> gateway_pb2_grpc.GatewayStub:
        return gateway_pb2_grpc.GatewayStub(self.channel(self.stack.gateway_address))

    def stub(self, instance: Instance) -> instance_pb2_grpc.InstanceStub:
        return instance_pb2_grpc.InstanceStub(self.channel(instance.address))

    def status(self, instance: Instance, timeout_s: float = 10.0) -> instance_pb2.InstanceStatus:
        return self.stub(instance).GetStatus(instance_pb2.StatusRequest(), timeout=timeout_s)

    def statuses(self, role: str | None = None) -> dict[str, instance_pb2.InstanceStatus]:
        return {instance.name: self.status(instance) for instance in self.instances(role)}

    # ---- blocks --------------------------------------------------------------------------

    def stranded_blocks(self) -> dict[str, tuple[int, int]]:
        """Live instances whose free-block count is below their total: name -> (free, total)."""
        stranded = {}
        for name, status in self.statuses().items():
            if status.num_free_blocks != status.num_total_blocks:
                stranded[name] = (status.num_free_blocks, status.num_total_blocks)
        return stranded

    def wait_all_blocks_free(self, timeout_s: float = 15.0) -> None:
        """Every live instance's free-block count back at its total (releases are async)."""
        deadline = time.monotonic() + timeout_s
        while (stranded := self.stranded_blocks()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not stranded, (f"blocks still held after {timeout_s} s (free, total): {stranded}; "
                              f"logs in {self.stack.run_dir / 'logs'}")

    # ---- cluster state in Redis ----------------------------------------------------------

    def registered_ids(self, role: str | None = None) -> set[str]:
        """Instance ids with a live registration in Redis that take new work (not draining)."""
        async def read() -> set[str]:
            async with redis.asyncio.Redis.from_url(self.stack.redis_url) as client:
                return await InstanceRegistry(client, self.namespace).live_instance_ids(role)
        return asyncio.run(read())

    def registered_states(self) -> dict[str, str]:
        """Every registered instance's state ("serving" or "draining"), by instance id."""
        async def read() -> dict[str, str]:
            async with redis.asyncio.Redis.from_url(self.stack.redis_url) as client:
                listing = await InstanceRegistry(client, self.namespace).list_live(include_draining=True)
                return {info.instance_id: info.state for info, _ in listing}
        return asyncio.run(read())

    def prefix_holders(self, token_ids: list[int], instance_ids: set[str]) -> dict[str, int]:
        """Leading full blocks of `token_ids` each given instance holds per the prefix index."""
        hashes = hash_full_blocks(token_ids, BLOCK_SIZE, (self.model_folder.name,))

        async def read() -> dict[str, int]:
            async with redis.asyncio.Redis.from_url(self.stack.redis_url) as client:
                return await PrefixIndex(client, self.namespace).longest_prefix(hashes, instance_ids)
        return asyncio.run(read())

    def indexed_ids(self) -> set[str]:
        """Instances that have an entry in the prefix index (live or not)."""
        async def read() -> set[str]:
            async with redis.asyncio.Redis.from_url(self.stack.redis_url) as client:
                return await PrefixIndex(client, self.namespace).indexed_instance_ids()
        return asyncio.run(read())

    def wait_for(self, predicate, timeout_s: float, what: str, interval_s: float = 0.2):
        """Poll `predicate()` until truthy; returns its value or fails naming `what`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(interval_s)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


# Each stack's instances share a host tier of their own (never another stack's, nor a
# /dev/shm one left by an earlier run): a test sees only the KV its own stack computed.
TEST_HOST_TIER_GB = "0.25"
# The gateway prefills every prompt on the prefill pool unless a module asks otherwise (its
# "gateway" extra args come after these and win): the tests of the disaggregated path use short
# prompts, which conditional disaggregation would prefill on the decode instance.
POOL_ONLY_GATEWAY_ARGS = ["--local-prefill-max-tokens", "0", "--local-prefill-busy-max-tokens", "0"]


def make_stack_config(model_folder: Path, dtype: str, num_prefill: int = 2, num_decode: int = 2,
                      extra_args: dict[str, list[str]] | None = None,
                      run_dir: Path | None = None, otlp_traces_endpoint: str = "",
                      kv_events_endpoint: str = "") -> StackConfig:
    """Loopback, ephemeral ports, one torch thread per instance; tracing to
    `otlp_traces_endpoint` when given (as `pdserve up --otlp-traces-endpoint` passes it on); KV
    events on `kv_events_endpoint` (instance k's suffixed by k) when given."""
    run_dir = Path(run_dir or tempfile.mkdtemp(prefix="pdserve-stack-"))
    extra_args = dict(extra_args or {})
    extra_args["gateway"] = [*POOL_ONLY_GATEWAY_ARGS, *extra_args.get("gateway", [])]
    return StackConfig(
        num_prefill=num_prefill, num_decode=num_decode, model=str(model_folder), dtype=dtype,
        num_threads=1, gateway_port=0, gateway_http_port=0, run_dir=run_dir, ready_timeout_s=300.0,
        instance_engine_args=(),
        stop_grace_s=10.0, extra_args=extra_args, otlp_traces_endpoint=otlp_traces_endpoint,
        kv_events_endpoint=kv_events_endpoint,
        env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
             "PDSERVE_KV_HOST_TIER_DIR": str(run_dir / "kv-tier"), "PDSERVE_KV_HOST_TIER_GB": TEST_HOST_TIER_GB},
    )


def start_test_stack(model_folder: Path, dtype: str, **kwargs) -> StackHarness:
    config = make_stack_config(model_folder, dtype, **kwargs)
    stack = LocalStack(config)
    stack.start()
    return StackHarness(stack, model_folder)


def running_supervised_stack(config: StackConfig, model_folder: Path) -> Iterator[StackHarness]:
    """For module-scoped fixtures: the stack of `config` with its supervisor running (dead children
    restarted, as under `pdserve up`), stopped at the end."""
    local = LocalStack(config)
    local.start()
    stop_event = threading.Event()
    supervisor = threading.Thread(target=local.supervise, args=(stop_event,), daemon=True)
    supervisor.start()
    try:
        yield StackHarness(local, model_folder)
    finally:
        stop_event.set()
        supervisor.join(5)
        local.stop()


def running_stack(model_folder: Path, dtype: str, **kwargs) -> Iterator[StackHarness]:
    """For module-scoped fixtures: `yield from running_stack(folder, "float32")`."""
    harness = start_test_stack(model_folder, dtype, **kwargs)
    try:
        yield harness
    finally:
        harness.stop()
