"""The standard gRPC health service, for the whole server ("") and the Gateway service."""

from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from shared.pb.pdserve.v1 import gateway_pb2

GATEWAY_SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name


class GatewayHealth:
    def __init__(self):
        self.servicer = health.aio.HealthServicer()
        self.is_serving = False  # also answers the HTTP `GET /health`

    def add_to_server(self, server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def set_serving(self, is_serving: bool) -> None:
        self.is_serving = is_serving
        status = (health_pb2.HealthCheckResponse.SERVING if is_serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", GATEWAY_SERVICE_NAME):
            await self.servicer.set(name, status)

    async def shut_down(self) -> None:
        """NOT_SERVING everywhere, for good (draining)."""
        self.is_serving = False
        await self.servicer.enter_graceful_shutdown()
