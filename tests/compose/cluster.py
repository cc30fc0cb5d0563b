"""What the compose scenario reads from the running cluster, all over loopback: the instances
registered in Redis, each one's status over gRPC (blocks free / total, running requests), and
the gateway's Prometheus counters."""

import asyncio
import re
import time
import urllib.request

import grpc
import redis.asyncio

from shared.cluster.instance_records import InstanceInfo
from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.pb.pdserve.v1 import instance_pb2, instance_pb2_grpc


class ClusterView:
    def __init__(self, redis_url: str, namespace: ClusterNamespace, gateway_http: str):
        self.redis_url = redis_url
        self.namespace = namespace
        self.gateway_http = gateway_http

    def registered(self, role: str | None = None) -> list[InstanceInfo]:
        """Instances with a live registration ([] while Redis is unreachable)."""
        async def read() -> list[InstanceInfo]:
            async with redis.asyncio.Redis.from_url(self.redis_url, socket_timeout=2) as client:
                return [info for info, _ in await InstanceRegistry(client, self.namespace).list_live(role)]
        try:
            return asyncio.run(read())
        except (OSError, redis.RedisError):
            return []

    def counts(self) -> dict[str, int]:
        infos = self.registered()
        return {role: sum(1 for info in infos if info.role == role) for role in ("prefill", "decode")}

    def status(self, grpc_address: str) -> instance_pb2.InstanceStatus | None:
        with grpc.insecure_channel(grpc_address) as channel:
            try:
                return instance_pb2_grpc.InstanceStub(channel).GetStatus(instance_pb2.StatusRequest(), timeout=10)
            except grpc.RpcError:
                return None

    def held_blocks(self) -> dict[str, int]:
        """Registered instances holding KV blocks: instance id -> blocks not free."""
        held = {}
        for info in self.registered():
            status = self.status(info.grpc_address)
            if status is not None and status.num_free_blocks != status.num_total_blocks:
                held[info.instance_id] = status.num_total_blocks - status.num_free_blocks
        return held

    def wait_blocks_free(self, timeout_s: float = 30.0) -> int:
        """Blocks still held after waiting up to `timeout_s` for every one to come back (releases
        and lease expiries are asynchronous): 0 is the target."""
        deadline = time.monotonic() + timeout_s
        while (held := self.held_blocks()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return sum(held.values())

    def gateway_counter(self, name: str) -> int:
        """Sum of a gateway counter over its labels (0 when it has no samples yet)."""
        text = urllib.request.urlopen(f"http://{self.gateway_http}/metrics", timeout=10).read().decode()
        pattern = rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$"
        return sum(int(float(value)) for value in re.findall(pattern, text, re.M))
