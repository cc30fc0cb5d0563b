"""One grpc.aio channel (and Instance stub) per instance address, reused across requests."""

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.pb.pdserve.v1 import instance_pb2_grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # prompt logprobs of long prompts are large
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Reconnect quickly to an instance that restarted on the same address.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


class InstanceChannels:
    def __init__(self):
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, instance_pb2_grpc.InstanceStub] = {}

    def stub(self, address: str) -> instance_pb2_grpc.InstanceStub:
        if address not in self._stubs:
            channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._channels[address] = channel
            self._stubs[address] = instance_pb2_grpc.InstanceStub(channel)
        return self._stubs[address]

    async def health(self, address: str, timeout_s: float) -> int | None:
        """The instance's health status (SERVING, NOT_SERVING while loading or draining), or
        None when it does not answer within `timeout_s`."""
        self.stub(address)
        health = health_pb2_grpc.HealthStub(self._channels[address])
        try:
            reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return None
        return reply.status

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()
