"""The one grpc.aio server set-up of the gateway and every instance.

A GrpcServer serves one pdserve service plus the standard health service (answering for ""
and for the service's full name: NOT_SERVING until `set_serving(True)`, and for good once
stopping) and server reflection (grpcurl works without the .proto files). It binds with TLS
when given credentials, refuses to share its port (Linux would otherwise let a second server
bind an occupied port silently and split the traffic: `start` raises ConfigurationError naming
the port setting instead), and stops gracefully: NOT_SERVING, no new RPCs, those in flight get
the grace period, then are cancelled.
"""

import logging
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from shared.errors import ConfigurationError
from shared.hosts import host_port
from shared.pb.pdserve.v1 import instance_pb2, instance_pb2_grpc

from services.rpc.malformed_requests import MalformedRequestInterceptor
from services.rpc.message_limits import message_size_options
from services.rpc.tracing_interceptors import server_interceptors
from services.rpc.reflection import enable_reflection

logger = logging.getLogger(__name__)

INSTANCE_SERVICE_NAME = instance_pb2.DESCRIPTOR.services_by_name["Instance"].full_name
NO_PORT_SHARING = ("grpc.so_reuseport", 0)

__all__ = ["GrpcServer", "INSTANCE_SERVICE_NAME", "ServerHealth", "host_port", "instance_grpc_server"]


class ServerHealth:
    """The standard health service for the whole server ("") and one named service."""

    def __init__(self, service_name: str):
        self.servicer = health.aio.HealthServicer()
        self.names = (health.OVERALL_HEALTH, service_name)
        self.is_serving = False  # the gateway's HTTP `GET /health` answers from this too

    async def set_serving(self, is_serving: bool) -> None:
        self.is_serving = is_serving
        status = health_pb2.HealthCheckResponse.SERVING if is_serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in self.names:
            await self.servicer.set(name, status)

    async def shut_down(self) -> None:
        """NOT_SERVING everywhere, for good (draining)."""
        self.is_serving = False
        await self.servicer.enter_graceful_shutdown()


class GrpcServer:
    def __init__(self, service_name: str, add_servicer: Callable[[grpc.aio.Server], None], host: str, port: int,
                 credentials: grpc.ServerCredentials | None = None, *, port_setting: str = "port",
                 options: Sequence[tuple[str, int]] = (), interceptors: Sequence = ()):
        """`add_servicer(server)` registers the service's servicer; `credentials`: TLS
        (services.tls.credentials), None: plain TCP; `port_setting` names the setting a taken port
        is blamed on."""
        self.server = grpc.aio.server(options=[NO_PORT_SHARING, *options], interceptors=list(interceptors))
        add_servicer(self.server)
        self.health = ServerHealth(service_name)
        health_pb2_grpc.add_HealthServicer_to_server(self.health.servicer, self.server)
        enable_reflection(self.server, [service_name, health.SERVICE_NAME])
        self.host = host
        self.port = port  # the bound one once started
        self.credentials = credentials
        self.port_setting = port_setting

    async def start(self) -> int:
        """Bind, start answering (health NOT_SERVING); returns the bound port."""
        self.port = self._bind()
        await self.health.set_serving(False)
        await self.server.start()
        return self.port

    def _bind(self) -> int:
        address = host_port(self.host, self.port)
        try:
            if self.credentials is None:
                port = self.server.add_insecure_port(address)
            else:
                port = self.server.add_secure_port(address, self.credentials)
        except RuntimeError:
            port = 0
        if port == 0:
            raise ConfigurationError(self.port_setting, f"cannot listen on {address}: the port is taken (by "
                                                        "another server?) or the host is not this machine's")
        return port

    async def set_serving(self, is_serving: bool) -> None:
        await self.health.set_serving(is_serving)

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING for good, refuse new RPCs, give those in flight `grace_s`, then cancel them."""
        await self.health.shut_down()
        await self.server.stop(grace_s)


def keepalive_options(keepalive_s: float, timeout_s: float) -> tuple[tuple[str, int], ...]:
    """Ping every caller's connection each `keepalive_s`, with or without calls in flight, and
    close it (cancelling its calls) when a ping stays unanswered for `timeout_s`: a caller
    that is alive but not running (SIGSTOPped, hung) otherwise holds its calls, and what they
    hold, until it resumes."""
    return (("grpc.keepalive_time_ms", max(1, round(keepalive_s * 1000))),
            ("grpc.keepalive_timeout_ms", max(1, round(timeout_s * 1000))),
            ("grpc.http2.ping_timeout_ms", max(1, round(timeout_s * 1000))),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # A stream whose caller sends nothing (a Decode) must not hold the pings back.
            ("grpc.http2.min_sent_ping_interval_without_data_ms", max(1, round(keepalive_s * 1000))))


def instance_grpc_server(servicer: instance_pb2_grpc.InstanceServicer, host: str, port: int,
                         credentials: grpc.ServerCredentials | None = None,
                         keepalive: Sequence[tuple[str, int]] = ()) -> GrpcServer:
    """An instance's server: the Instance service, internal message limits, requests that must
    arrive whole (services.rpc.malformed_requests), `keepalive` (keepalive_options)."""
    return GrpcServer(INSTANCE_SERVICE_NAME, lambda server: instance_pb2_grpc.add_InstanceServicer_to_server(
                          servicer, server),
                      host, port, credentials, port_setting="grpc_port",
                      options=(*message_size_options(), *keepalive),
                      interceptors=[*server_interceptors(), MalformedRequestInterceptor()])
