"""The benchmark's streaming clients against a real in-process gateway (gRPC and OpenAI HTTP)
whose engine instances are the fakes of gateway_fakes.py: a prefill instance that samples
token 42, a decode instance streaming "Hello" [42], " world" [43], "!" [44]."""

import asyncio
import contextlib

import pytest

from services.gateway.server import GatewayServer
from services.gateway.served_model import ServedModel
from services.gateway.settings import GatewaySettings
from services.bench.clients import ClientOptions, make_client
from services.bench.clients.openai_client import api_base, first_model_id
from services.bench.datasets import BenchPrompt
from services.bench.records import RequestRecord
from services.bench.runner import LoadShape, run_benchmark
from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from tests.helpers.redis_server import connect_async
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import Behaviour, FakeInstance, start_fakes

MODEL_NAME = "smollm2-test"
PROMPT = BenchPrompt(list(range(100, 150)), output_len=3, prompt_text="Say hello")


@pytest.fixture
def model(smollm2_tokenizer):  # noqa: F811
    return ServedModel(name=MODEL_NAME, model_key=MODEL_NAME, tokenizer=smollm2_tokenizer,
                       vocab_size=49152, max_model_len=2048)


@contextlib.asynccontextmanager
async def gateway_with_fakes(redis_url: str, model: ServedModel, decode_behaviour: Behaviour | None = None):
    """A SERVING gateway (gRPC + HTTP on free ports) with one fake prefill and one fake decode."""
    redis_client = connect_async(redis_url)
    settings = GatewaySettings(port=0, http_port=0, redis_url=redis_url, deployment="test", routing_cache_s=0)
    server = GatewayServer(settings, load_model=lambda: model)
    address = await server.start()
    await server.become_ready()
    registry = InstanceRegistry(redis_client, ClusterNamespace("test", MODEL_NAME))
    fakes = await start_fakes(registry, MODEL_NAME, FakeInstance("p0", "prefill"),
                              FakeInstance("d0", "decode", decode_behaviour))
    try:
        yield address, f"http://{server.http_address}", fakes
    finally:
        await server.stop(grace_s=1.0)
        for fake in fakes:
            await fake.stop()
        await redis_client.aclose()


def run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), timeout=60))


async def send_one(options: ClientOptions, prompt: BenchPrompt = PROMPT) -> RequestRecord:
    client = make_client(options)
    record = RequestRecord(0, prompt.prompt_len, prompt.output_len)
    try:
        await client.send(prompt, record)
    finally:
        await client.close()
    return record


def test_grpc_client_sends_token_ids_and_times_every_token(redis_server, model):
    async def scenario():
        async with gateway_with_fakes(redis_server.url, model) as (address, _, (p0, d0)):
            record = await send_one(ClientOptions("pdserve-grpc", address, ignore_eos=True))
            assert record.error is None
            assert record.chunk_num_tokens == [1, 1, 1] and record.num_output_tokens == 3
            assert record.chunk_times_s == sorted(record.chunk_times_s)
            assert 0 < record.chunk_times_s[0] and record.chunk_times_s[-1] <= record.end_s
            [reserve] = d0.requests_of("Reserve")
            assert list(reserve.prompt_token_ids) == PROMPT.prompt_token_ids
            assert (reserve.sampling.max_tokens, reserve.sampling.temperature) == (3, 0.0)
            assert reserve.sampling.ignore_eos is True
    run(scenario)


def test_grpc_client_records_the_error_instead_of_raising(redis_server, model):
    async def scenario():
        async with gateway_with_fakes(redis_server.url, model) as (address, _, _):
            record = await send_one(ClientOptions("pdserve-grpc", address, model="no-such-model"))
            assert record.error.startswith("NOT_FOUND: ") and not record.is_success
    run(scenario)


@pytest.mark.parametrize("backend", ["openai", "openai-chat"])
def test_openai_clients_stream_sse_and_read_usage(redis_server, model, backend):
    async def scenario():
        async with gateway_with_fakes(redis_server.url, model) as (_, base_url, (p0, d0)):
            assert await first_model_id(base_url) == MODEL_NAME
            record = await send_one(ClientOptions(backend, base_url, model=MODEL_NAME, ignore_eos=True))
            assert record.error is None
            assert record.chunk_num_tokens == [1, 1, 1]
            assert record.reported_output_len == 3
            [reserve] = d0.requests_of("Reserve")
            assert reserve.sampling.max_tokens == 3 and reserve.sampling.ignore_eos is True
            if backend == "openai":
                assert list(reserve.prompt_token_ids) == PROMPT.prompt_token_ids
            else:
                text = model.tokenizer.decode(list(reserve.prompt_token_ids))
                assert "<|im_start|>user\nSay hello<|im_end|>" in text  # the chat template applied
    run(scenario)


def test_openai_client_records_http_errors(redis_server, model):
    async def scenario():
        async with gateway_with_fakes(redis_server.url, model) as (_, base_url, _):
            record = await send_one(ClientOptions("openai", base_url + "/v1", model="no-such-model"))
            assert record.error.startswith("HTTP 404: ")
    run(scenario)


def test_a_run_at_infinite_rate_summarizes_every_request(redis_server, model):
    async def scenario():
        async with gateway_with_fakes(redis_server.url, model) as (address, _, _):
            client = make_client(ClientOptions("pdserve-grpc", address))
            try:
                result = await run_benchmark(client, [PROMPT] * 4, LoadShape(float("inf"), max_concurrency=2),
                                             show_progress=False)
            finally:
                await client.close()
            assert (result.summary.num_completed, result.summary.num_failed) == (4, 0)
            assert result.summary.total_output_tokens == 12
            assert [record.index for record in result.records] == [0, 1, 2, 3]
    run(scenario)


def test_api_base_accepts_urls_with_or_without_v1():
    assert api_base("http://h:8000") == "http://h:8000/v1"
    assert api_base("http://h:8000/v1/") == "http://h:8000/v1"
