"""The Gateway servicer in process, against fake Instance servers registered in a real Redis:
prefill failover, decode refusals, cancellation and deadlines, prefix-aware routing, fan-out."""

import asyncio
import contextlib
from dataclasses import dataclass, field

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.gateway.server import GatewayServer
from services.gateway.served_model import ServedModel
from services.gateway.settings import GatewaySettings
from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.cluster.prefix_index import PrefixIndex
from shared.kv_cache.block_hash import HashRecipe, prompt_block_hashes
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import gateway_pb2_grpc
from shared.pb.pdserve.v1 import generation_pb2 as gen
from tests.helpers.redis_server import connect_async
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import FIRST_TOKEN_ID, POOL_ONLY, Behaviour, FakeInstance, start_fakes

MODEL_NAME = "smollm2-test"
PROMPT_IDS = list(range(100, 150))  # 3 full blocks of 16 + 2 tokens
PROMPT_HASHES = prompt_block_hashes(PROMPT_IDS, HashRecipe(MODEL_NAME, 16))  # as the fakes register


@pytest.fixture
def model(smollm2_tokenizer):  # noqa: F811
    return ServedModel(name=MODEL_NAME, model_key=MODEL_NAME, tokenizer=smollm2_tokenizer,
                       vocab_size=49152, max_model_len=2048)


@dataclass
class Harness:
    server: GatewayServer
    stub: gateway_pb2_grpc.GatewayStub
    channel: grpc.aio.Channel
    registry: InstanceRegistry
    index: PrefixIndex
    fakes: list[FakeInstance] = field(default_factory=list)

    @property
    def stats(self):
        return self.server.state.relay.stats

    async def add(self, *fakes: FakeInstance) -> None:
        self.fakes += await start_fakes(self.registry, MODEL_NAME, *fakes)


@contextlib.asynccontextmanager
async def gateway(redis_url: str, model: ServedModel, **overrides):
    client = connect_async(redis_url)
    namespace = ClusterNamespace("test", MODEL_NAME)
    settings = GatewaySettings(port=0, http_port=-1, redis_url=redis_url, deployment="test", routing_cache_s=0,
                               **{**POOL_ONLY, **overrides})
    server = GatewayServer(settings, load_model=lambda: model)
    address = await server.start()
    await server.become_ready()
    channel = grpc.aio.insecure_channel(address)
    harness = Harness(server, gateway_pb2_grpc.GatewayStub(channel), channel,
                      InstanceRegistry(client, namespace), PrefixIndex(client, namespace))
    try:
        yield harness
    finally:
        await channel.close()
        await server.stop(grace_s=1.0)
        for fake in harness.fakes:
            await fake.stop()
        await client.aclose()


def generate_request(**sampling) -> gw.GenerateRequest:
    return gw.GenerateRequest(request_id="r1", token_ids=gw.TokenIds(ids=PROMPT_IDS),
                              sampling=gen.SamplingParams(**sampling))


async def collect(call) -> list[gen.GenerateResponse]:
    return [message async for message in call]


async def wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), timeout=60))


def test_failed_prefill_is_retried_on_the_other_instance_and_client_sees_only_tokens(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_error=grpc.StatusCode.UNAVAILABLE))
            p1 = FakeInstance("p1", "prefill", Behaviour(num_cached_prompt_tokens=16))
            d0 = FakeInstance("d0", "decode", Behaviour(num_cached_prompt_tokens=32))
            await gate.add(p0, p1, d0)
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert "".join(m.text for m in messages) == "Hello world!"
            assert [t for m in messages for t in m.token_ids] == [42, 43, 44]
            assert {m.request_id for m in messages} == {"r1"}
            assert messages[-1].finish_reason == gen.FINISH_REASON_STOP
            assert messages[-1].usage.cached_prompt_tokens == 16  # prefill's prefix-cache hits
            assert (p0.methods(), p1.methods(), d0.methods()) == (["StreamPrefill"], ["StreamPrefill"], ["Reserve", "Decode"])
            prefill = p1.requests_of("StreamPrefill")[0]
            assert (prefill.decode_ucx_address, list(prefill.dst_block_ids)) == ("ucx-d0", [7, 8, 9, 10])
            assert prefill.num_skip_blocks == 2
            assert list(prefill.prompt_token_ids) == PROMPT_IDS
            assert d0.requests_of("Decode")[0].first_token_id == FIRST_TOKEN_ID
            assert gate.stats.num_prefill_retries == 1
            assert gate.stats.num_completed == 1
    run(scenario)


def test_all_decodes_refusing_is_resource_exhausted_at_once_when_requests_may_not_wait_for_room(redis_server,
                                                                                                   model):
    async def scenario():
        async with gateway(redis_server.url, model, max_room_wait_s=0) as gate:
            full = Behaviour(reserve_error=grpc.StatusCode.RESOURCE_EXHAUSTED)
            d0, d1 = FakeInstance("d0", "decode", full), FakeInstance("d1", "decode", full)
            p0 = FakeInstance("p0", "prefill")
            await gate.add(d0, d1, p0)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(gate.stub.Generate(generate_request()))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "refused" in caught.value.details()
            assert (d0.methods(), d1.methods(), p0.methods()) == (["Reserve"], ["Reserve"], [])
            assert gate.stats.num_decode_refusals == 2
            assert gate.stats.failures["RESOURCE_EXHAUSTED"] == 1
    run(scenario)


def test_a_slow_prefill_renews_the_decode_lease_until_it_answers(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model, lease_s=0.3) as gate:
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_delay_s=0.75))
            d0 = FakeInstance("d0", "decode")
            await gate.add(p0, d0)
            [*messages] = [message async for message in gate.stub.Generate(generate_request())]
            assert messages[-1].finish_reason == gen.FINISH_REASON_STOP
            renewals = d0.requests_of("Renew")
            assert len(renewals) >= 2  # every 0.1 s while the prefill took 0.75 s
            assert {(r.request_id, r.lease_ms) for r in renewals} == {("r1", 300)}
            assert d0.methods() == ["Reserve"] + ["Renew"] * len(renewals) + ["Decode"]
            assert gate.stats.num_lease_renewals == len(renewals)
    run(scenario)


def test_client_cancel_during_prefill_cancels_it_and_releases_the_reservation(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_blocks=True))
            d0 = FakeInstance("d0", "decode")
            await gate.add(p0, d0)
            call = gate.stub.Generate(generate_request())
            await asyncio.wait_for(p0.started.wait(), 5)
            call.cancel()
            await asyncio.wait_for(p0.cancelled.wait(), 5)
            await wait_until(lambda: d0.methods() == ["Reserve", "Release"])
            assert d0.requests_of("Release")[0].request_id == "r1"
            await wait_until(lambda: gate.stats.num_cancelled == 1)
    run(scenario)


def test_cancelled_fan_out_releases_every_reservation(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_blocks=True))
            d0 = FakeInstance("d0", "decode")
            await gate.add(p0, d0)
            call = gate.stub.Generate(generate_request(n=2))
            await wait_until(lambda: len(p0.requests_of("StreamPrefill")) == 2)
            call.cancel()
            await wait_until(lambda: len(d0.requests_of("Release")) == 2)
            assert sorted(r.request_id for r in d0.requests_of("Release")) == ["r1#0", "r1#1"]
            assert "Decode" not in d0.methods()
    run(scenario)


def test_client_cancel_during_decode_cancels_the_decode_call_without_release(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode", Behaviour(decode_blocks_after_first=True))
            await gate.add(p0, d0)
            call = gate.stub.Generate(generate_request())
            first = await call.read()
            assert first.text == "Hello"  # from the prefill instance, before Decode
            await asyncio.wait_for(d0.waiting.wait(), 5)  # Decode sent "Hello" (kept from the client) and waits
            call.cancel()
            await asyncio.wait_for(d0.cancelled.wait(), 5)
            await wait_until(lambda: gate.stats.num_cancelled == 1)  # the relay's cleanup has run
            await gate.server.state.relay.drain_background()
            assert d0.methods() == ["Reserve", "Decode"]
    run(scenario)


def test_client_deadline_reaches_prefill_and_frees_the_reservation(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_blocks=True))
            d0 = FakeInstance("d0", "decode")
            await gate.add(p0, d0)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(gate.stub.Generate(generate_request(), timeout=0.5))
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.wait_for(p0.cancelled.wait(), 5)
            await wait_until(lambda: d0.methods() == ["Reserve", "Release"])
    run(scenario)


def test_prefix_holding_instances_are_chosen(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            fakes = [FakeInstance(i, role) for i, role in
                     (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode"))]
            await gate.add(*fakes)
            p0, p1, d0, d1 = fakes
            await gate.index.add("p1", PROMPT_HASHES[:2])
            await gate.index.add("d1", PROMPT_HASHES[:1])
            await gate.index.add("p0", PROMPT_HASHES[1:])  # not a prefix: counts for nothing
            await collect(gate.stub.Generate(generate_request()))
            assert (p0.methods(), p1.methods()) == ([], ["StreamPrefill"])
            assert (d0.methods(), d1.methods()) == ([], ["Reserve", "Decode"])
            assert gate.stats.routing["prefill:prefix"] == 1
            assert gate.stats.routing["decode:prefix"] == 1
    run(scenario)


def test_no_live_instance_is_unavailable_and_colocated_serves_alone(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(gate.stub.Generate(generate_request()))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            c0 = FakeInstance("c0", "colocated")
            await gate.add(c0, FakeInstance("d0", "decode"))
            messages = await collect(gate.stub.Generate(generate_request()))
            assert "".join(m.text for m in messages) == "Hello world!"
            assert c0.methods() == ["Generate"]
            assert gate.stats.routing["colocated:only"] == 1
    run(scenario)


def test_n_completions_fan_out_and_merge_with_indices_and_total_usage(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0, d0 = FakeInstance("p0", "prefill"), FakeInstance("d0", "decode")
            await gate.add(p0, d0)
            messages = await collect(gate.stub.Generate(generate_request(n=3, seed=5, prompt_logprobs=0)))
            texts = {i: "".join(m.text for m in messages if m.index == i) for i in range(3)}
            assert texts == {0: "Hello world!", 1: "Hello world!", 2: "Hello world!"}
            assert {m.request_id for m in messages} == {"r1"}
            assert [m.HasField("usage") for m in messages].count(True) == 1
            assert messages[-1].usage == gen.Usage(prompt_tokens=len(PROMPT_IDS), completion_tokens=9,
                                                   cached_prompt_tokens=0)
            assert [len(m.prompt_logprobs) for m in messages if m.prompt_logprobs] == [len(PROMPT_IDS) - 1]
            reserves = d0.requests_of("Reserve")
            assert sorted((r.request_id, r.sampling.seed, r.sampling.n) for r in reserves) == [
                ("r1#0", 5, 1), ("r1#1", 6, 1), ("r1#2", 7, 1)]
    run(scenario)


def test_bad_request_unknown_model_and_health(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            health = health_pb2_grpc.HealthStub(gate.channel)
            for service in ("", "pdserve.v1.Gateway"):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(gate.stub.Generate(generate_request(temperature=-1.0)))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details().startswith("temperature:")
            bad_model = gw.GenerateRequest(model="nope", text="hi")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(gate.stub.Generate(bad_model))
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            models = await gate.stub.ListModels(gw.ListModelsRequest())
            assert [(m.id, m.max_model_len) for m in models.models] == [(MODEL_NAME, 2048)]
            tokens = await gate.stub.Tokenize(gw.TokenizeRequest(text="Hello world"))
            assert len(tokens.token_ids) == len(tokens.tokens) >= 2
    run(scenario)


def test_health_is_not_serving_until_ready(redis_server, model):
    async def scenario():
        server = GatewayServer(GatewaySettings(port=0, http_port=-1, redis_url=redis_server.url),
                               load_model=lambda: model)
        address = await server.start()
        async with grpc.aio.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await gateway_pb2_grpc.GatewayStub(channel).ListModels(gw.ListModelsRequest())
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            await server.become_ready()
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        await server.stop(grace_s=0.5)
    run(scenario)


# ---- a Reserve left unanswered may still have been granted: it is released at once --------

def test_a_deadline_during_reserve_releases_the_reservation_at_once(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode", Behaviour(reserve_blocks=True))
            await gate.add(p0, d0)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(gate.stub.Generate(generate_request(), timeout=0.5))
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await wait_until(lambda: d0.methods() == ["Reserve", "Release"])
            [release] = d0.requests_of("Release")
            assert release.request_id == d0.requests_of("Reserve")[0].request_id
            assert p0.methods() == []
    run(scenario)


def test_a_client_cancel_during_reserve_releases_the_reservation_at_once(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode", Behaviour(reserve_blocks=True))
            await gate.add(p0, d0)
            call = gate.stub.Generate(generate_request())
            await wait_until(lambda: d0.methods() == ["Reserve"])
            call.cancel()
            await wait_until(lambda: d0.methods() == ["Reserve", "Release"])
    run(scenario)


def test_a_request_that_fails_in_the_engine_is_not_retried_nor_blamed_on_the_instance(redis_server, model):
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_request_failed=True))
            p1 = FakeInstance("p1", "prefill", Behaviour(prefill_request_failed=True))
            d0 = FakeInstance("d0", "decode")
            await gate.add(p0, p1, d0)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(gate.stub.Generate(generate_request()))
            assert caught.value.code() == grpc.StatusCode.INTERNAL
            assert "request failed in the engine" in caught.value.details()
            assert len(p0.methods() + p1.methods()) == 1  # tried once, not on the other instance
            assert gate.stats.num_prefill_retries == 0
            await wait_until(lambda: d0.methods() == ["Reserve", "Release"])
    run(scenario)
