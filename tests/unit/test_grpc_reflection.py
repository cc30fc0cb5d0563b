"""gRPC server reflection on the gateway and on instances: a client with no .proto files
(as grpcurl) lists the services and resolves their descriptors."""

import asyncio

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from services.rpc.server import instance_grpc_server
from services.gateway.server import GatewayServer
from services.gateway.settings import GatewaySettings
from shared.pb.pdserve.v1 import instance_pb2_grpc


def _describe(address: str) -> tuple[list[str], list[str]]:
    """(service names, method names of the first pdserve service) as a reflection client sees them."""
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = sorted(database.get_services())
        pool = DescriptorPool(database)
        pdserve = next(name for name in services if name.startswith("pdserve."))
        methods = [method.name for method in pool.FindServiceByName(pdserve).methods]
    return services, methods


def test_gateway_lists_its_services_by_reflection():
    async def scenario():
        server = GatewayServer(GatewaySettings(port=0, http_port=-1), load_model=lambda: None)
        address = await server.start()
        try:
            return await asyncio.to_thread(_describe, address)
        finally:
            await server.stop(grace_s=0.5)
    services, methods = asyncio.run(scenario())
    assert "pdserve.v1.Gateway" in services
    assert "grpc.health.v1.Health" in services
    assert "grpc.reflection.v1alpha.ServerReflection" in services
    assert {"Generate", "ListModels", "Tokenize"} <= set(methods)


def test_instance_lists_its_services_by_reflection():
    async def scenario():
        server = instance_grpc_server(instance_pb2_grpc.InstanceServicer(), "127.0.0.1", 0)
        port = await server.start()
        try:
            return await asyncio.to_thread(_describe, f"127.0.0.1:{port}")
        finally:
            await server.stop(grace_s=0.5)
    services, methods = asyncio.run(scenario())
    assert "pdserve.v1.Instance" in services
    assert {"Prefill", "Decode", "Reserve"} <= set(methods)
