"""The instance's grpc.aio server: the Instance service plus the standard health and reflection
services.

Health answers for "" (the whole server) and for the Instance service's full name:
NOT_SERVING while the engine loads and while draining, SERVING in between.
"""

import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from shared.pb.pdserve.v1 import instance_pb2, instance_pb2_grpc

from services.common.grpc_limits import message_size_options
from services.common.malformed_requests import MalformedRequestInterceptor
from services.common.reflection import enable_reflection
from services.common.tls import add_port

logger = logging.getLogger(__name__)

INSTANCE_SERVICE_NAME = instance_pb2.DESCRIPTOR.services_by_name["Instance"].full_name
HEALTH_SERVICE_NAMES = (health.OVERALL_HEALTH, INSTANCE_SERVICE_NAME)
# Without this, Linux lets a second server bind an occupied port silently.
SERVER_OPTIONS = [("grpc.so_reuseport", 0), *message_size_options()]


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcServer:
    def __init__(self, servicer: instance_pb2_grpc.InstanceServicer, host: str, port: int,
                 credentials: grpc.ServerCredentials | None = None):
        """`credentials`: TLS (services.common.tls.server_credentials); None: plain TCP."""
        self.server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=[MalformedRequestInterceptor()])
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        instance_pb2_grpc.add_InstanceServicer_to_server(servicer, self.server)
        enable_reflection(self.server, [INSTANCE_SERVICE_NAME, health.SERVICE_NAME])
        self.port = add_port(self.server, host_port(host, port), credentials)

    async def start(self) -> int:
        """Start answering (health NOT_SERVING); returns the bound port."""
        await self.set_serving(False)
        await self.server.start()
        return self.port

    async def set_serving(self, is_serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if is_serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in HEALTH_SERVICE_NAMES:
            await self.health.set(name, status)

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING for good, refuse new RPCs, give those in flight `grace_s`, then cancel them."""
        await self.set_serving(False)
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
