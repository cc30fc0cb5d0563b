"""TLS with real certificates on loopback: `pdserve certs` makes a CA and certificates; the
gateway serves gRPC and HTTPS with them; instances serve mutual TLS and accept only clients
whose certificate the stack's CA signed; a gateway configured with its client certificate
relays a request through instances that require it."""

import asyncio
import ssl
import urllib.request
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.rpc.server import instance_grpc_server
from services.tls.credentials import channel_credentials, server_credentials
from services.rpc.health_probe import probe_credentials
from services.launcher.readiness import is_serving
from services.cli.main import main
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import gateway_pb2_grpc, instance_pb2_grpc
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import FakeInstance
from tests.unit.test_openai_http import Harness, http_gateway, model, run  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[2]
CERT_FILES = ["ca-key.pem", "ca.pem", "gateway-key.pem", "gateway.pem", "instance-key.pem", "instance.pem"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("certs")
    assert main(["certs", "--out", str(folder), "--host", "pdserve.example"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == CERT_FILES
    return folder


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory):
    """Certificates from another CA: an outsider's."""
    folder = tmp_path_factory.mktemp("other_certs")
    assert main(["certs", "--out", str(folder)]) == 0
    return folder


def pem(folder, name: str) -> str:
    return str(folder / name)


class MutualTlsFake(FakeInstance):
    """A fake instance whose server requires a client certificate signed by the CA."""

    def __init__(self, instance_id: str, role: str, certs):
        super().__init__(instance_id, role)
        self.certs = certs

    async def start(self) -> None:
        self.server = grpc.aio.server()
        instance_pb2_grpc.add_InstanceServicer_to_server(self, self.server)
        credentials = server_credentials(pem(self.certs, "instance.pem"), pem(self.certs, "instance-key.pem"),
                                         pem(self.certs, "ca.pem"))
        port = self.server.add_secure_port("127.0.0.1:0", credentials)
        await self.server.start()
        self.address = f"127.0.0.1:{port}"


def https_status(url: str, ca_file: str) -> int:
    context = ssl.create_default_context(cafile=ca_file)
    with urllib.request.urlopen(url, context=context, timeout=10) as reply:
        return reply.status


def test_the_gateway_serves_grpc_and_https_over_tls(redis_server, model, certs, other_certs):
    async def scenario():
        async with http_gateway(redis_server.url, model, tls_cert_file=pem(certs, "gateway.pem"),
                                tls_key_file=pem(certs, "gateway-key.pem")) as gate:
            trusted = channel_credentials(pem(certs, "ca.pem"))
            async with grpc.aio.secure_channel(gate.server.address, trusted) as channel:
                reply = await gateway_pb2_grpc.GatewayStub(channel).ListModels(gw.ListModelsRequest(), timeout=10)
                assert reply.models[0].id == model.name
            for credentials in (channel_credentials(pem(other_certs, "ca.pem")), None):
                channel = (grpc.aio.insecure_channel(gate.server.address) if credentials is None
                           else grpc.aio.secure_channel(gate.server.address, credentials))
                async with channel:
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await gateway_pb2_grpc.GatewayStub(channel).ListModels(gw.ListModelsRequest(), timeout=5)
                    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            url = f"https://{gate.server.http_address}/health"
            assert await asyncio.to_thread(https_status, url, pem(certs, "ca.pem")) == 200
            with pytest.raises(urllib.error.URLError):
                await asyncio.to_thread(https_status, url, pem(other_certs, "ca.pem"))
    run(scenario)


def test_instances_accept_only_clients_with_a_certificate_from_the_stacks_ca(certs, other_certs):
    async def check(address: str, credentials) -> bool:
        async with grpc.aio.secure_channel(address, credentials) as channel:
            try:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                return False
            return True

    async def scenario():
        credentials = server_credentials(pem(certs, "instance.pem"), pem(certs, "instance-key.pem"),
                                         pem(certs, "ca.pem"))
        server = instance_grpc_server(FakeInstance("d0", "decode"), "127.0.0.1", 0, credentials)
        await server.start()
        try:
            address = f"127.0.0.1:{server.port}"
            ca = pem(certs, "ca.pem")
            assert await check(address, channel_credentials(ca, pem(certs, "gateway.pem"), pem(certs, "gateway-key.pem")))
            assert not await check(address, channel_credentials(ca))  # no client certificate
            assert not await check(address, channel_credentials(
                ca, pem(other_certs, "gateway.pem"), pem(other_certs, "gateway-key.pem")))  # another CA's
        finally:
            await server.stop(0)
    asyncio.run(scenario())


def test_a_request_goes_through_instances_that_require_mutual_tls(redis_server, model, certs):
    async def scenario():
        async with http_gateway(redis_server.url, model, instance_tls_ca_file=pem(certs, "ca.pem"),
                                instance_tls_cert_file=pem(certs, "gateway.pem"),
                                instance_tls_key_file=pem(certs, "gateway-key.pem")) as gate:
            await gate.add(MutualTlsFake("p0", "prefill", certs), MutualTlsFake("d0", "decode", certs))
            reply = await gate.client.completions.create(model=model.name, prompt=[1, 2, 3], max_tokens=3)
            assert reply.choices[0].text == "Hello world!"
    run(scenario)


def test_the_container_probe_speaks_mutual_tls_with_the_containers_own_certificate(certs):
    environ = {"PDSERVE_TLS_CERT_FILE": pem(certs, "instance.pem"), "PDSERVE_TLS_KEY_FILE": pem(certs, "instance-key.pem"),
               "PDSERVE_TLS_CA_FILE": pem(certs, "ca.pem")}

    async def scenario():
        credentials = server_credentials(pem(certs, "instance.pem"), pem(certs, "instance-key.pem"),
                                         pem(certs, "ca.pem"))
        server = instance_grpc_server(FakeInstance("d0", "decode"), "127.0.0.1", 0, credentials)
        await server.start()
        await server.set_serving(True)
        try:
            address = f"127.0.0.1:{server.port}"
            assert await asyncio.to_thread(is_serving, address, "", 5.0, probe_credentials(environ))
            assert not await asyncio.to_thread(is_serving, address, "", 5.0, None)
        finally:
            await server.stop(0)
    asyncio.run(scenario())


def test_the_compose_tls_override_configures_every_service():
    override = yaml.safe_load((REPO_ROOT / "deploy" / "compose" / "tls.yml").read_text())
    services = override["services"]
    assert services["gateway"]["environment"]["PDSERVE_INSTANCE_TLS_CA_FILE"] == "/certs/ca.pem"
    for role in ("prefill", "decode"):
        assert services[role]["environment"]["PDSERVE_TLS_CA_FILE"] == "/certs/ca.pem"
        assert services[role]["volumes"] == ["./certs:/certs:ro"]
