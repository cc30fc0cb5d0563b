"""The gateway's OpenAI-compatible HTTP API, driven by the official `openai` client
(unchanged, `base_url=http://127.0.0.1:PORT/v1`), in process against fake Instance servers
registered in a real Redis: completions and chat, streamed and not, usage, n, logprobs,
stop, every error status in OpenAI's shape, and disconnects that cancel downstream calls."""

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import grpc
import openai
import pytest

from services.gateway.served_model import ServedModel
from services.gateway.server import GatewayServer
from services.gateway.settings import GatewaySettings
from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.pb.pdserve.v1 import generation_pb2 as gen
from shared.tokenization import apply_chat_template, encode_prompt
from tests.helpers.redis_server import connect_async
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import POOL_ONLY, Behaviour, FakeInstance, fake_logprobs, start_fakes

MODEL_NAME = "smollm2-test"
PROMPT_IDS = list(range(100, 150))
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
# The fakes' Decode usage says 5 prompt and 3 completion tokens; the gateway puts prefill's
# cached count (0 here) in place of the decode instance's.
USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
         "prompt_tokens_details": {"cached_tokens": 0}}


@pytest.fixture
def model(smollm2_tokenizer):  # noqa: F811
    return ServedModel(name=MODEL_NAME, model_key=MODEL_NAME, tokenizer=smollm2_tokenizer,
                       vocab_size=49152, max_model_len=2048)


class DecodeWithLogprobs(FakeInstance):
    """A fake decode instance whose tokens carry logprobs: -0.5 each, one alternative (7)."""

    async def Decode(self, request, context):
        async for message in super().Decode(request, context):
            message.logprobs.extend(fake_logprobs(t) for t in message.token_ids)
            yield message


@dataclass
class Harness:
    server: GatewayServer
    client: openai.AsyncOpenAI
    registry: InstanceRegistry
    fakes: list[FakeInstance] = field(default_factory=list)

    @property
    def stats(self):
        return self.server.state.relay.stats

    async def add(self, *fakes: FakeInstance) -> None:
        self.fakes += await start_fakes(self.registry, MODEL_NAME, *fakes)


@contextlib.asynccontextmanager
async def http_gateway(redis_url: str, model: ServedModel, is_ready: bool = True,
                       timeout_s: float = 20.0, **overrides):
    redis_client = connect_async(redis_url)
    settings = GatewaySettings(port=0, http_port=0, redis_url=redis_url, deployment="test",
                               routing_cache_s=0, **{**POOL_ONLY, **overrides})
    server = GatewayServer(settings, load_model=lambda: model)
    await server.start()
    if is_ready:
        await server.become_ready()
    client = openai.AsyncOpenAI(base_url=f"http://{server.http_address}/v1", api_key="unused",
                                max_retries=0, timeout=timeout_s)
    harness = Harness(server, client, InstanceRegistry(redis_client, ClusterNamespace("test", MODEL_NAME)))
    try:
        yield harness
    finally:
        await client.close()
        await server.stop(grace_s=1.0)
        for fake in harness.fakes:
            await fake.stop()
        await redis_client.aclose()


async def with_pair(gate: Harness, decode_behaviour: Behaviour | None = None,
                    prefill_behaviour: Behaviour | None = None) -> tuple[FakeInstance, FakeInstance]:
    p0 = FakeInstance("p0", "prefill", prefill_behaviour)
    d0 = FakeInstance("d0", "decode", decode_behaviour)
    await gate.add(p0, d0)
    return p0, d0


async def wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), timeout=60))


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_completion_sends_every_sampling_field_and_returns_text_and_usage(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            _, d0 = await with_pair(gate)
            reply = await gate.client.completions.create(
                model=MODEL_NAME, prompt=PROMPT_IDS, max_tokens=7, temperature=0.5, top_p=0.9, seed=3,
                stop=["END", "\n\n"], presence_penalty=0.1, frequency_penalty=0.2,
                extra_body={"top_k": 5, "min_p": 0.05, "min_tokens": 2, "ignore_eos": True,
                            "repetition_penalty": 1.1, "stop_token_ids": [9, 10], "use_speculation": False})
            assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
            assert reply.model == MODEL_NAME
            [choice] = reply.choices
            assert (choice.index, choice.text, choice.finish_reason) == (0, "Hello world!", "stop")
            assert choice.logprobs is None
            assert reply.usage.model_dump(exclude_none=True) == USAGE
            [reserve] = d0.requests_of("Reserve")
            assert list(reserve.prompt_token_ids) == PROMPT_IDS
            sent = dict(max_tokens=7, temperature=0.5, top_p=0.9, seed=3, presence_penalty=0.1,
                        frequency_penalty=0.2, top_k=5, min_p=0.05, min_tokens=2, ignore_eos=True,
                        repetition_penalty=1.1, n=1, use_speculation=False)
            assert {name: getattr(reserve.sampling, name) for name in sent} == pytest.approx(sent)
            assert list(reserve.sampling.stop) == ["END", "\n\n"]
            assert list(reserve.sampling.stop_token_ids) == [9, 10]
            assert gate.stats.num_completed == 1
    run(scenario)


def test_completion_stream_sends_deltas_then_a_usage_chunk(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            _, d0 = await with_pair(gate)
            stream = await gate.client.completions.create(
                model=MODEL_NAME, prompt="Say hello", stop="END", stream=True,
                stream_options={"include_usage": True})
            chunks = [chunk async for chunk in stream]
            assert [[c.text for c in chunk.choices] for chunk in chunks] == [["Hello"], [" world"], ["!"], []]
            assert [chunk.choices[0].finish_reason for chunk in chunks[:3]] == [None, None, "stop"]
            assert [chunk.usage for chunk in chunks[:3]] == [None, None, None]
            assert chunks[-1].usage.model_dump(exclude_none=True) == USAGE
            assert len({chunk.id for chunk in chunks}) == 1
            [reserve] = d0.requests_of("Reserve")
            assert list(reserve.sampling.stop) == ["END"]
            assert reserve.sampling.max_tokens == 16  # OpenAI's default for completions
            assert list(reserve.prompt_token_ids) == encode_prompt(model.tokenizer, "Say hello")
    run(scenario)


def test_chat_applies_the_template_streamed_and_not(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            _, d0 = await with_pair(gate)
            reply = await gate.client.chat.completions.create(
                model=MODEL_NAME, messages=CHAT, max_completion_tokens=9, max_tokens=4)
            assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
            [choice] = reply.choices
            assert (choice.message.role, choice.message.content, choice.finish_reason) == (
                "assistant", "Hello world!", "stop")
            assert reply.usage.total_tokens == 8
            stream = await gate.client.chat.completions.create(model=MODEL_NAME, messages=CHAT, stream=True)
            chunks = [chunk async for chunk in stream]
            assert [chunk.object for chunk in chunks] == ["chat.completion.chunk"] * 4
            assert chunks[0].choices[0].delta.role == "assistant"
            assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == "Hello world!"
            assert [chunk.choices[0].finish_reason for chunk in chunks] == [None, None, None, "stop"]
            expected_ids = apply_chat_template(model.tokenizer, CHAT)
            first, second = d0.requests_of("Reserve")
            assert list(first.prompt_token_ids) == list(second.prompt_token_ids) == expected_ids
            assert first.sampling.max_tokens == 9  # max_completion_tokens wins
            assert not second.sampling.HasField("max_tokens")  # chat: up to the model's length
    run(scenario)


def test_n_and_a_batch_of_prompts_give_one_choice_each(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            _, d0 = await with_pair(gate)
            reply = await gate.client.completions.create(
                model=MODEL_NAME, prompt=["One", "Two"], n=2, seed=11)
            assert [(c.index, c.text) for c in reply.choices] == [(i, "Hello world!") for i in range(4)]
            num_prompt_tokens = sum(len(encode_prompt(model.tokenizer, text)) for text in ("One", "Two"))
            assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (num_prompt_tokens, 12)
            reserves = sorted((r.request_id[-4:], r.sampling.seed) for r in d0.requests_of("Reserve"))
            assert reserves == [("-0#0", 11), ("-0#1", 12), ("-1#0", 11), ("-1#1", 12)]
            chat = await gate.client.chat.completions.create(model=MODEL_NAME, messages=CHAT, n=2)
            assert [(c.index, c.message.content) for c in chat.choices] == [
                (0, "Hello world!"), (1, "Hello world!")]
    run(scenario)


def test_logprobs_in_the_completion_and_chat_shapes(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            await gate.add(FakeInstance("p0", "prefill"), DecodeWithLogprobs("d0", "decode"))
            text = model.tokenizer.decode
            tokens = [text([42]), text([43]), text([44])]
            reply = await gate.client.completions.create(model=MODEL_NAME, prompt="Hi", logprobs=1)
            logprobs = reply.choices[0].logprobs
            assert logprobs.tokens == tokens
            assert logprobs.token_logprobs == [-0.5, -0.5, -0.5]
            assert logprobs.top_logprobs == [{token: -0.5, text([7]): -1.5} for token in tokens]
            assert logprobs.text_offset == [0, len(tokens[0]), len(tokens[0]) + len(tokens[1])]
            chat = await gate.client.chat.completions.create(
                model=MODEL_NAME, messages=CHAT, logprobs=True, top_logprobs=1)
            content = chat.choices[0].logprobs.content
            assert [(c.token, c.logprob, c.bytes) for c in content] == [
                (t, -0.5, list(t.encode())) for t in tokens]
            assert [[(top.token, top.logprob) for top in c.top_logprobs] for c in content] == [
                [(t, -0.5)] for t in tokens]
            assert [r.sampling.logprobs for r in gate.fakes[1].requests_of("Reserve")] == [1, 1]
    run(scenario)


def test_bad_fields_are_400_naming_the_openai_field(redis_server, model):
    cases = [  # (endpoint, fields besides the model, the field named)
        ("completions", dict(prompt="Hi", temperature=-1), "temperature"),
        ("completions", dict(prompt="", max_tokens=3), "prompt"),
        ("completions", dict(prompt="Hi", extra_body={"top_k": "x"}), "top_k"),
        ("completions", dict(prompt=[[1, 2], [-3]]), "prompt"),
        ("chat", dict(messages=CHAT, max_completion_tokens=0), "max_completion_tokens"),
        ("chat", dict(messages=CHAT, top_logprobs=2), "top_logprobs"),
        ("chat", dict(messages=[{"role": "robot", "content": "x"}]), "messages"),
    ]

    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            await with_pair(gate)
            endpoints = {"completions": gate.client.completions, "chat": gate.client.chat.completions}
            for endpoint, fields, param in cases:
                with pytest.raises(openai.BadRequestError) as caught:
                    await endpoints[endpoint].create(model=MODEL_NAME, **fields)
                error = caught.value.body
                assert (caught.value.status_code, error["param"]) == (400, param)
                assert error["type"] == "invalid_request_error"
                assert error["message"].startswith(f"{param}:"), error["message"]
            assert gate.fakes[1].requests_of("Reserve") == []
    run(scenario)


def test_unknown_model_is_404_and_models_are_listed(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            with pytest.raises(openai.NotFoundError) as caught:
                await gate.client.chat.completions.create(model="gpt-17", messages=CHAT)
            assert caught.value.body["code"] == "model_not_found"
            assert caught.value.body["param"] == "model"
            models = await gate.client.models.list()
            assert [(m.id, m.object, m.owned_by) for m in models.data] == [(MODEL_NAME, "model", "pdserve")]
    run(scenario)


def test_out_of_capacity_is_429_and_no_backend_is_503_streamed_or_not(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model, max_room_wait_s=0) as gate:
            for stream in (False, True):
                with pytest.raises(openai.InternalServerError) as caught:
                    await gate.client.completions.create(model=MODEL_NAME, prompt="Hi", stream=stream)
                assert caught.value.status_code == 503
                assert caught.value.body["code"] == "no_backend"
            await with_pair(gate, Behaviour(reserve_error=grpc.StatusCode.RESOURCE_EXHAUSTED))
            for stream in (False, True):
                with pytest.raises(openai.RateLimitError) as caught:
                    await gate.client.completions.create(model=MODEL_NAME, prompt="Hi", stream=stream)
                assert caught.value.status_code == 429
                assert "refused" in caught.value.body["message"]
            assert gate.stats.failures == {"UNAVAILABLE": 2, "RESOURCE_EXHAUSTED": 2}
    run(scenario)


def test_deadline_is_504(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model, default_deadline_s=0.3) as gate:
            p0, d0 = await with_pair(gate, prefill_behaviour=Behaviour(prefill_blocks=True))
            with pytest.raises(openai.APIStatusError) as caught:
                await gate.client.completions.create(model=MODEL_NAME, prompt="Hi")
            assert (caught.value.status_code, caught.value.body["code"]) == (504, "deadline_exceeded")
            await wait_until(lambda: d0.methods() == ["Reserve", "Release"])
    run(scenario)


def test_client_disconnect_mid_stream_cancels_the_decode_call(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            _, d0 = await with_pair(gate, Behaviour(decode_blocks_after_first=True))
            stream = await gate.client.chat.completions.create(model=MODEL_NAME, messages=CHAT, stream=True)
            chunks = [await anext(stream), await anext(stream)]
            assert chunks[1].choices[0].delta.content == "Hello"  # from the prefill instance, before Decode
            await asyncio.wait_for(d0.waiting.wait(), 5)  # Decode sent "Hello" (kept from the client) and waits
            await stream.close()
            await asyncio.wait_for(d0.cancelled.wait(), 5)
            await wait_until(lambda: gate.stats.num_cancelled == 1)
            assert d0.methods() == ["Reserve", "Decode"]
    run(scenario)


def test_client_gone_during_prefill_cancels_it_and_releases_the_reservation(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model, timeout_s=0.5) as gate:
            p0, d0 = await with_pair(gate, prefill_behaviour=Behaviour(prefill_blocks=True))
            with pytest.raises(openai.APITimeoutError):
                await gate.client.completions.create(model=MODEL_NAME, prompt="Hi")
            await asyncio.wait_for(p0.cancelled.wait(), 5)
            await wait_until(lambda: d0.methods() == ["Reserve", "Release"])
            await wait_until(lambda: gate.stats.num_cancelled == 1)
    run(scenario)


def test_health_ready_file_and_not_ready_gateway(redis_server, model, tmp_path):
    async def scenario():
        ready_file = tmp_path / "gateway.json"
        async with http_gateway(redis_server.url, model, is_ready=False, ready_file=str(ready_file)) as gate:
            ready = json.loads(ready_file.read_text())
            assert ready == {"grpc_address": gate.server.address, "http_address": gate.server.http_address}
            url = f"http://{gate.server.http_address}/health"
            assert await asyncio.to_thread(get_json, url) == (503, {"status": "not_serving"})
            with pytest.raises(openai.InternalServerError) as caught:
                await gate.client.completions.create(model=MODEL_NAME, prompt="Hi")
            assert caught.value.status_code == 503
            await gate.server.become_ready()
            assert await asyncio.to_thread(get_json, url) == (200, {"status": "serving"})
    run(scenario)
