"""One grpc.aio channel (and Instance stub) per instance address, reused across requests."""

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.pb.pdserve.v1 import instance_pb2_grpc

from services.rpc.message_limits import message_size_options
from services.rpc.tracing_interceptors import client_interceptors

CHANNEL_OPTIONS = (
    *message_size_options(),  # the instances' servers use the same limits
    # Reconnect quickly to an instance that restarted on the same address.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


class InstanceChannels:
    def __init__(self, credentials: grpc.ChannelCredentials | None = None):
        """`credentials`: mutual TLS to the instances (services.tls.credentials); None: plain TCP."""
        self._credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, instance_pb2_grpc.InstanceStub] = {}

    def stub(self, address: str) -> instance_pb2_grpc.InstanceStub:
        if address not in self._stubs:
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS,
                                                    interceptors=client_interceptors())
            else:
                channel = grpc.aio.secure_channel(address, self._credentials, options=CHANNEL_OPTIONS,
                                                  interceptors=client_interceptors())
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
