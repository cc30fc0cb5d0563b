"""Bad input at the gateway, both doors, against fake instances: request limits (400 /
INVALID_ARGUMENT naming the field, never echoing the oversized value, nothing sent
downstream), lone surrogates, every HTTP error in OpenAI's shape, and cache_salt over HTTP."""

import argparse
import asyncio
import json

import grpc
import pytest

from services.rpc.message_limits import MAX_INTERNAL_MESSAGE_BYTES
from services.gateway.http import app as app_module
from services.gateway.limits import RequestLimits, check_fits_internal_hops, largest_internal_message_bytes
from services.gateway.settings import add_arguments, settings_from_args
from shared.errors import ConfigurationError
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import gateway_pb2_grpc
from shared.pb.pdserve.v1 import generation_pb2 as gen
from tests.helpers.raw_http import assert_openai_error, post
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.test_openai_http import MODEL_NAME, http_gateway, model, run, with_pair  # noqa: F401

SURROGATE = "a\ud800b"


async def apost(address: str, path: str, body, **kwargs) -> tuple[int, dict, dict]:
    return await asyncio.to_thread(post, address, path, body, **kwargs)


OVERSIZED_BODIES = {
    "model": {"model": "m" * 1_000_000, "prompt": "hi"},
    "prompt": {"prompt": "word " * 300_000},
    "messages": {"messages": [{"role": "user", "content": "x"}] * 2000},
    "n": {"prompt": "hi", "n": 33},
    "logprobs": {"prompt": "hi", "logprobs": 21},
    "stop": {"prompt": "hi", "stop": ["s"] * 40},
    "stop_token_ids": {"prompt": "hi", "stop_token_ids": list(range(2000))},
    "guided_json": {"prompt": "hi", "guided_json": {"type": "object", "description": "d" * 10_000_000}},
    "guided_regex": {"prompt": "hi", "guided_regex": "a" * 600_000},
    "guided_choice": {"prompt": "hi", "guided_choice": ["c" * 1000] * 600},
}


def test_every_request_limit_is_a_400_naming_the_field_before_anything_is_sent(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            p0, d0 = await with_pair(gate)
            for param, body in OVERSIZED_BODIES.items():
                path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
                status, reply, _ = await apost(gate.server.http_address, path, body)
                assert_openai_error(status, reply, 400, param)
            assert p0.calls == [] and d0.calls == []
    run(scenario)


def test_grpc_limits_are_invalid_argument_naming_the_field_never_resource_exhausted(redis_server, model):
    schema = json.dumps({"type": "object", "description": "d" * 10_000_000})
    requests = {
        "guided.json_schema": gw.GenerateRequest(text="hi", sampling=gen.SamplingParams(
            guided=gen.GuidedDecoding(json_schema=schema))),
        "model": gw.GenerateRequest(text="hi", model="m" * 100_000),
        "text": gw.GenerateRequest(text="word " * 300_000),
    }

    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            p0, d0 = await with_pair(gate)
            async with grpc.aio.insecure_channel(gate.server.address, options=[
                    ("grpc.max_send_message_length", 64 << 20)]) as channel:
                stub = gateway_pb2_grpc.GatewayStub(channel)
                for field, request in requests.items():
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await stub.Generate(request).read()
                    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
                    assert caught.value.details().startswith(field), caught.value.details()[:200]
                    assert len(caught.value.details()) <= 1024
            assert p0.calls == [] and d0.calls == []
    run(scenario)


def test_a_grpc_schema_no_value_satisfies_is_invalid_argument_before_any_instance_call(redis_server, model):
    request = gw.GenerateRequest(text="hi", sampling=gen.SamplingParams(
        max_tokens=2, guided=gen.GuidedDecoding(json_schema='{"not": {}}')))

    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            p0, d0 = await with_pair(gate)
            async with grpc.aio.insecure_channel(gate.server.address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await gateway_pb2_grpc.GatewayStub(channel).Generate(request).read()
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details() == ('guided.json_schema: no value satisfies this schema: '
                                              '"not": {} refuses every value')
            assert p0.calls == [] and d0.calls == []
    run(scenario)


def test_a_body_over_max_request_bytes_is_413(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model, max_request_bytes=10_000) as gate:
            status, reply, _ = await apost(gate.server.http_address, "/v1/completions",
                                           {"prompt": "x" * 20_000})
            assert_openai_error(status, reply, 413)
            status, _, _ = await apost(gate.server.http_address, "/v1/completions",
                                       {"prompt": [1, 2, 3], "max_tokens": 2})
            assert status == 503  # under the limit: through to the (unregistered) backend
    run(scenario)


SURROGATE_BODIES = {
    "prompt": [{"prompt": SURROGATE}, {"prompt": ["fine", SURROGATE]}],
    "messages": [{"messages": [{"role": "user", "content": SURROGATE}]},
                 {"messages": [{"role": SURROGATE, "content": "hi"}]},
                 {"messages": [{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]}],
    "stop": [{"prompt": "hi", "stop": SURROGATE}, {"prompt": "hi", "stop": ["ok", SURROGATE]}],
    "model": [{"prompt": "hi", "model": SURROGATE}],
    "guided_regex": [{"prompt": "hi", "guided_regex": SURROGATE}],
    "guided_choice": [{"prompt": "hi", "guided_choice": ["a", SURROGATE]}],
    "guided_json": [{"prompt": "hi", "guided_json": {"type": "string", "enum": [SURROGATE]}}],
    "cache_salt": [{"prompt": "hi", "cache_salt": SURROGATE}],
}


def test_lone_surrogates_are_400_naming_the_field(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            p0, d0 = await with_pair(gate)
            for param, bodies in SURROGATE_BODIES.items():
                for body in bodies:
                    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
                    status, reply, _ = await apost(gate.server.http_address, path, body)
                    assert_openai_error(status, reply, 400, param)
            assert p0.calls == [] and d0.calls == []
    run(scenario)


def test_every_http_error_is_openai_shaped(redis_server, model, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            address = gate.server.http_address
            assert_openai_error(*(await apost(address, "/v1/nowhere", {}))[:2], 404)
            assert_openai_error(*(await apost(address, "/v1/completions", None, method="GET"))[:2], 405)
            assert_openai_error(*(await apost(address, "/v1/completions", b"{not json"))[:2], 400)
            assert_openai_error(*(await apost(address, "/v1/completions", b"\xff\xfe"))[:2], 400)
            assert_openai_error(*(await apost(address, "/v1/completions", [1, 2]))[:2], 400)
            monkeypatch.setattr(app_module, "completion_to_internal", broken)
            status, reply, _ = await apost(address, "/v1/completions", {"prompt": "hi"})
            assert_openai_error(status, reply, 500)
            assert "a bug" not in reply["error"]["message"]
    run(scenario)


def test_cache_salt_over_http_reaches_both_instances_and_changes_the_block_hashes(redis_server, model):
    prompt = list(range(100, 164))  # four full blocks

    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            p0, d0 = await with_pair(gate)
            for salt in ("a1", "b2"):
                await gate.client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=2,
                                                     extra_body={"cache_salt": salt})
                await gate.client.chat.completions.create(
                    model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                    extra_body={"cache_salt": salt})
            salts = [r.cache_salt for r in d0.requests_of("Reserve")]
            assert salts == ["a1", "a1", "b2", "b2"]
            assert [r.cache_salt for r in p0.requests_of("StreamPrefill")] == salts
    run(scenario)


def test_limits_are_flags_and_variables_and_must_fit_the_internal_hops(monkeypatch):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    monkeypatch.setenv("PDSERVE_MAX_N", "4")
    settings = settings_from_args(parser.parse_args(["--max-prompts", "3"]))
    assert (settings.limits.max_prompts, settings.limits.max_n) == (3, 4)
    assert settings.limits.max_guided_bytes == RequestLimits().max_guided_bytes
    assert largest_internal_message_bytes(RequestLimits(), 8192) < MAX_INTERNAL_MESSAGE_BYTES // 4
    check_fits_internal_hops(RequestLimits(), 8192)
    with pytest.raises(ConfigurationError, match="^max_guided_bytes: "):
        check_fits_internal_hops(RequestLimits(max_guided_bytes=MAX_INTERNAL_MESSAGE_BYTES), 8192)
    with pytest.raises(ConfigurationError, match="^max_n: "):
        RequestLimits(max_n=0)
