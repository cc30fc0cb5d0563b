"""The gateway's Prometheus metrics (the client's view), scraped from its own --metrics-port
and from `GET /metrics` on the HTTP API, after requests routed to fake instances."""

import asyncio
import contextlib

import grpc
import pytest

from services.gateway.server import GatewayServer
from services.gateway.settings import GatewaySettings
from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import gateway_pb2_grpc
from tests.helpers.redis_server import connect_async
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import FakeInstance, start_fakes
from tests.unit.metrics_scrape import scrape, value
from tests.unit.test_gateway_service import MODEL_NAME, PROMPT_IDS, generate_request, model  # noqa: F401


@contextlib.asynccontextmanager
async def gateway_with_metrics(redis_url: str, served_model):
    settings = GatewaySettings(port=0, http_port=0, metrics_port=0, redis_url=redis_url, deployment="test",
                               routing_cache_s=0)
    server = GatewayServer(settings, load_model=lambda: served_model)
    address = await server.start()
    await server.become_ready()
    client = connect_async(redis_url)
    registry = InstanceRegistry(client, ClusterNamespace("test", MODEL_NAME))
    fakes = await start_fakes(registry, MODEL_NAME, FakeInstance("p0", "prefill"), FakeInstance("d0", "decode"))
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            yield server, gateway_pb2_grpc.GatewayStub(channel)
    finally:
        await server.stop(grace_s=1.0)
        for fake in fakes:
            await fake.stop()
        await client.aclose()


def test_gateway_metrics_after_routed_requests(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway_with_metrics(redis_server.url, model) as (server, stub):
            for request_id in ("r1", "r2"):
                request = generate_request(max_tokens=3)
                request.request_id = request_id
                assert len([m async for m in stub.Generate(request)]) == 3
            with pytest.raises(grpc.aio.AioRpcError):
                await anext(aiter(stub.Generate(gw.GenerateRequest(model="other", token_ids=gw.TokenIds(ids=[1])))))
            own, http = [await asyncio.to_thread(scrape, a) for a in (server.metrics_address, server.http_address)]
            for samples in (own, http):
                assert value(samples, "pdserve:gateway_requests_total") == 3
                assert value(samples, "pdserve:gateway_requests_completed_total") == 2
                assert value(samples, "pdserve:gateway_failures_total", code="NOT_FOUND") == 1
                assert value(samples, "pdserve:gateway_routing_decisions_total", role="decode", reason="only") == 2
                assert value(samples, "pdserve:gateway_routing_decisions_total", role="prefill", reason="only") == 2
                assert value(samples, "pdserve:gateway_prompt_tokens_total") == 2 * len(PROMPT_IDS)
                assert value(samples, "pdserve:gateway_generation_tokens_total") == 2 * 3
                assert value(samples, "pdserve:gateway_time_to_first_token_seconds_count") == 2
                assert value(samples, "pdserve:gateway_inter_token_latency_seconds_count") == 2 * 2
                assert value(samples, "pdserve:gateway_e2e_request_latency_seconds_count") == 2
                assert value(samples, "pdserve:gateway_releases_total") == 0
                assert value(samples, "pdserve:gateway_lease_renewals_total") == 0
                assert value(samples, "pdserve:gateway_live_instances", role="prefill") == 1
                assert value(samples, "pdserve:gateway_live_instances", role="colocated") == 0
                assert value(samples, "pdserve:gateway_requests_total", model_name=MODEL_NAME) == 3
    asyncio.run(asyncio.wait_for(scenario(), timeout=60))
