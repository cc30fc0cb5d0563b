"""API keys and per-key rate limits at the gateway, over HTTP and gRPC (in process, fake
instances): 401 / UNAUTHENTICATED without the right key, /health open, /metrics as
configured, 429 with Retry-After / RESOURCE_EXHAUSTED over a key's rate or concurrency, the
key never in a log line."""

import argparse
import asyncio
import logging
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.gateway.api_keys import ApiKeys, load_api_keys
from services.gateway.rate_limits import KeyRateLimiter, KeyStats
from services.gateway.settings import add_arguments, settings_from_args
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import gateway_pb2_grpc
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.helpers.raw_http import assert_openai_error
from tests.unit.test_gateway_bad_input import apost
from tests.unit.test_openai_http import http_gateway, model, run, with_pair  # noqa: F401

KEY = "sk-test-0123456789"
OTHER_KEY = "sk-other-abcdef"
BODY = {"prompt": [1, 2, 3], "max_tokens": 2}


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_keys_are_matched_exactly_and_named_by_index(tmp_path):
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# a comment\n\n{OTHER_KEY}\n")
    keys = load_api_keys([KEY], str(keys_file))
    assert (len(keys), repr(keys)) == (2, "ApiKeys(2 keys)")
    assert keys.identify(f"Bearer {KEY}") == "key-0"
    assert keys.identify(f"bearer {OTHER_KEY}") == "key-1"
    for wrong in (None, "", KEY, f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer ", f"Basic {KEY}"):
        assert keys.identify(wrong) is None, wrong
    assert not ApiKeys().is_enabled


def test_keys_come_from_repeated_flags_or_a_comma_separated_variable(monkeypatch):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    monkeypatch.delenv("PDSERVE_API_KEY", raising=False)
    from_flags = settings_from_args(parser.parse_args(["--api-key", "a", "--api-key", "b"]))
    assert from_flags.api_key == ("a", "b")
    monkeypatch.setenv("PDSERVE_API_KEY", "a, b,")
    from_env = settings_from_args(parser.parse_args([]))
    assert from_env.api_key == ("a", "b")
    assert "'a'" not in repr(from_env)


def test_token_bucket_refuses_past_the_burst_and_refills_with_time():
    clock = FakeClock()
    limiter = KeyRateLimiter(requests_per_s=2.0, burst=3, clock=clock)
    assert [limiter.admit("k") for _ in range(3)] == [None] * 3
    assert limiter.admit("k") == pytest.approx(0.5)
    assert limiter.admit("other") is None  # buckets are per key
    clock.now += 0.5
    assert limiter.admit("k") is None
    assert limiter.admit("k") == pytest.approx(0.5)
    assert [(s.key_id, s.num_admitted, s.num_over_rate) for s in limiter.stats()] == [("k", 4, 2), ("other", 1, 0)]


def test_concurrency_cap_frees_a_slot_on_release():
    limiter = KeyRateLimiter(max_concurrent=2, clock=FakeClock())
    assert limiter.admit("k") is None and limiter.admit("k") is None
    assert limiter.admit("k") is not None
    limiter.release("k")
    assert limiter.admit("k") is None
    assert limiter.stats() == [KeyStats("k", num_admitted=3, num_over_rate=0, num_over_concurrency=1, num_running=2)]


def test_http_needs_the_key_except_on_health_and_metrics(redis_server, model, caplog):
    caplog.set_level(logging.DEBUG)

    async def scenario():
        async with http_gateway(redis_server.url, model, api_key=(KEY,)) as gate:
            await with_pair(gate)
            address = gate.server.http_address
            status, body, headers = await apost(address, "/v1/completions", BODY)
            assert_openai_error(status, body, 401)
            assert headers.get("www-authenticate") == "Bearer"
            wrong = await apost(address, "/v1/completions", BODY, headers={"authorization": f"Bearer {OTHER_KEY}"})
            assert_openai_error(*wrong[:2], 401)
            assert_openai_error(*(await apost(address, "/v1/models", None, method="GET"))[:2], 401)
            good = await apost(address, "/v1/completions", BODY, headers={"authorization": f"Bearer {KEY}"})
            assert good[0] == 200, good[1]
            assert (await apost(address, "/health", None, method="GET"))[0] == 200
    run(scenario)
    assert KEY not in caplog.text and OTHER_KEY not in caplog.text


def get_status(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code


def test_metrics_can_require_the_key(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model, api_key=(KEY,), metrics_requires_key=True) as gate:
            url = f"http://{gate.server.http_address}/metrics"
            assert await asyncio.to_thread(get_status, url, {}) == 401
            assert await asyncio.to_thread(get_status, url, {"authorization": f"Bearer {KEY}"}) == 200
        async with http_gateway(redis_server.url, model, api_key=(KEY,)) as gate:
            assert await asyncio.to_thread(get_status, f"http://{gate.server.http_address}/metrics", {}) == 200
    run(scenario)


def test_grpc_needs_the_key_in_metadata_and_health_stays_open(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model, api_key=(KEY,)) as gate:
            await with_pair(gate)
            async with grpc.aio.insecure_channel(gate.server.address) as channel:
                stub = gateway_pb2_grpc.GatewayStub(channel)
                for metadata in (None, (("authorization", f"Bearer {OTHER_KEY}"),)):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.ListModels(gw.ListModelsRequest(), metadata=metadata)
                    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.Generate(gw.GenerateRequest(token_ids=gw.TokenIds(ids=[1, 2])),
                                            metadata=metadata).read()
                    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                good = (("authorization", f"Bearer {KEY}"),)
                assert (await stub.ListModels(gw.ListModelsRequest(), metadata=good)).models
                replies = [m async for m in stub.Generate(gw.GenerateRequest(token_ids=gw.TokenIds(ids=[1, 2])),
                                                          metadata=good)]
                assert replies[-1].usage.completion_tokens == 3
                health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
                assert health.status == health_pb2.HealthCheckResponse.SERVING
    run(scenario)


def test_a_key_over_its_rate_gets_429_with_retry_after_on_both_doors(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model, api_key=(KEY, OTHER_KEY), rate_limit_rps=0.01,
                                rate_limit_burst=2) as gate:
            await with_pair(gate)
            address = gate.server.http_address
            auth = {"authorization": f"Bearer {KEY}"}
            assert (await apost(address, "/v1/completions", BODY, headers=auth))[0] == 200
            status, body, headers = await apost(address, "/v1/completions", BODY, headers=auth)
            assert status == 200, body
            status, body, headers = await apost(address, "/v1/completions", BODY, headers=auth)
            assert_openai_error(status, body, 429)
            assert int(headers["retry-after"]) >= 1
            other = await apost(address, "/v1/completions", BODY, headers={"authorization": f"Bearer {OTHER_KEY}"})
            assert other[0] == 200  # another key's bucket is full
            async with grpc.aio.insecure_channel(gate.server.address) as channel:
                call = gateway_pb2_grpc.GatewayStub(channel).ListModels(
                    gw.ListModelsRequest(), metadata=(("authorization", f"Bearer {KEY}"),))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert dict(refused.value.trailing_metadata())["retry-after"] == headers["retry-after"]
            await apost(address, "/v1/completions", BODY, headers={"authorization": "Bearer sk-wrong"})
            metrics = await asyncio.to_thread(get_text, f"http://{address}/metrics")
            model_label = f'model_name="{gate.server.state.model.name}"'
            for series in ('pdserve:gateway_key_requests_admitted_total{key="key-0",%s} 2.0',
                           'pdserve:gateway_key_requests_admitted_total{key="key-1",%s} 1.0',
                           'pdserve:gateway_key_requests_limited_total{key="key-0",limit="rate",%s} 2.0',
                           'pdserve:gateway_key_requests_limited_total{key="key-0",limit="concurrency",%s} 0.0',
                           'pdserve:gateway_key_requests_running{key="key-0",%s} 0.0',
                           'pdserve:gateway_unauthenticated_requests_total{%s} 1.0'):
                assert series % model_label in metrics.splitlines(), series
    run(scenario)


def get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()
