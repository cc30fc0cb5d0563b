"""The gateway's health: the standard gRPC health service for the whole server ("") and the
Gateway service (services.rpc.server.ServerHealth), which `GET /health` reads too."""

from shared.pb.pdserve.v1 import gateway_pb2

from services.rpc.server import ServerHealth

GATEWAY_SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
GatewayHealth = ServerHealth
