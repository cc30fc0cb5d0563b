"""The one gRPC server set-up (services.rpc.server): a second server on a taken port
fails to start naming the port setting (Linux would otherwise let both bind it and split the
traffic), for the gateway and for instances alike; health starts NOT_SERVING."""

import asyncio
import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import services.decode
from services.rpc.server import instance_grpc_server
from services.gateway.__main__ import main as gateway_main
from services.gateway.server import GatewayServer
from services.gateway.settings import GatewaySettings
from shared.errors import ConfigurationError
from shared.hosts import host_port, local_host
from shared.pb.pdserve.v1 import instance_pb2_grpc


def test_a_second_gateway_on_the_same_port_fails_to_start():
    async def scenario():
        first = GatewayServer(GatewaySettings(port=0, http_port=-1), load_model=lambda: None)
        address = await first.start()
        port = int(address.rsplit(":", 1)[1])
        second = GatewayServer(GatewaySettings(port=port, http_port=-1), load_model=lambda: None)
        try:
            with pytest.raises(ConfigurationError) as refused:
                await second.start()
            return refused.value
        finally:
            await second.stop(grace_s=0)
            await first.stop(grace_s=0)
    error = asyncio.run(scenario())
    assert error.field == "port" and "the port is taken" in error.message


def test_a_second_instance_server_on_the_same_port_fails_to_start():
    async def scenario():
        first = instance_grpc_server(instance_pb2_grpc.InstanceServicer(), "127.0.0.1", 0)
        port = await first.start()
        second = instance_grpc_server(instance_pb2_grpc.InstanceServicer(), "127.0.0.1", port)
        try:
            with pytest.raises(ConfigurationError) as refused:
                await second.start()
            return port, refused.value, await _health(f"127.0.0.1:{port}")
        finally:
            await first.stop(grace_s=0)
    port, error, status = asyncio.run(scenario())
    assert error.field == "grpc_port" and f"cannot listen on 127.0.0.1:{port}" in error.message
    assert status == health_pb2.HealthCheckResponse.NOT_SERVING  # the first still answers


async def _health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    return reply.status


def test_entry_points_exit_2_naming_the_taken_port(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert gateway_main(["--port", str(port), "--no-http"]) == 2
        assert f"--port: cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
        assert services.decode.main(["--grpc-port", str(port), "--redis-url", "redis://127.0.0.1:1/0"]) == 2


def test_wildcard_hosts_are_dialed_on_loopback():
    assert [local_host(host) for host in ("", "0.0.0.0", "::", "[::]", "10.0.0.2")] == [
        "127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1", "10.0.0.2"]
    assert (host_port("::1", 5), host_port("[::1]", 5), host_port("h", 5)) == ("[::1]:5", "[::1]:5", "h:5")
