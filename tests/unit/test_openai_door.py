"""A decode instance's own OpenAI HTTP API (--openai-port), in-process: a prefill and a decode
instance of the tiny model, a real Redis, real UCX, and a gateway over the same instances to
compare with. The endpoint picker's header names the prefill instance that computes the prompt;
an endpoint that cannot be used (malformed, unknown, down, another role or version) means the
prompt is computed on the decode instance, logged and counted, with the same greedy tokens.
"""

import asyncio
import contextlib
import dataclasses
import json
import socket
import urllib.request
from collections import Counter

import pytest

import services.decode
import services.prefill
from services.gateway.relay_context import HangTimeouts
from services.gateway.served_model import ServedModel
from services.gateway.server import GatewayServer
from services.gateway.settings import GatewaySettings
from services.instance.runtime import InstanceRuntime
from shared.cluster.instances import InstanceLoad, InstanceRegistry
from shared.cluster.versions import KV_PROTOCOL_VERSION
from tests.helpers.redis_server import connect_async
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.test_instance_services import Instance, assert_everything_freed, make_settings, prompt_ids

import grpc
from shared.pb.pdserve.v1.instance_pb2_grpc import InstanceStub

PROMPT_LENGTH = 37  # three blocks of 16 and 5 tokens; each request its own prompt (no prefix hits)
MAX_TOKENS = 6
TIMEOUT_S = 30.0


@dataclasses.dataclass
class Pod:
    prefill: Instance
    decode: Instance
    gateway: GatewayServer

    @property
    def outcomes(self):
        return self.decode.runtime.openai.counters.outcomes

    async def computed(self) -> tuple[int, int]:
        """Prompt tokens computed so far by (prefill, decode)."""
        prefill, decode = await self.prefill.status(), await self.decode.status()
        return prefill.num_prompt_tokens_computed, decode.num_prompt_tokens_computed


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(address: str, body: dict, headers: dict | None = None) -> dict:
    request = urllib.request.Request(f"http://{address}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return json.loads(response.read())


async def complete(address: str, prompt: list[int], headers: dict | None = None, **extra) -> dict:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
            "logprobs": 0, **extra}
    return await asyncio.to_thread(post, address, body, headers)


def tokens(response: dict) -> list[str]:
    return response["choices"][0]["logprobs"]["tokens"]


@contextlib.asynccontextmanager
async def running(settings, load_model=None):
    build = services.prefill.build_handlers if settings.role == "prefill" else services.decode.build_handlers
    runtime = InstanceRuntime(settings, build, load_openai_model=load_model)
    try:
        await runtime.start()
        async with grpc.aio.insecure_channel(runtime.grpc_address) as channel:
            instance = Instance(runtime, InstanceStub(channel), channel)
            yield instance
            await assert_everything_freed(instance)
    finally:
        await runtime.stop()


@contextlib.asynccontextmanager
async def pod(folder, redis_url: str, tokenizer):
    def model(key: str) -> ServedModel:
        return ServedModel(name="tiny", model_key=key, tokenizer=tokenizer, vocab_size=256, max_model_len=128)

    async with running(make_settings("prefill", folder, redis_url)) as prefill:
        key = prefill.runtime.presence.namespace.model
        decode_settings = make_settings("decode", folder, redis_url, openai_port=0)
        async with running(decode_settings, lambda: model(key)) as decode:
            settings = GatewaySettings(port=0, http_port=0, redis_url=redis_url, deployment="unit", routing_cache_s=0)
            gateway = GatewayServer(settings, load_model=lambda: model(key))
            await gateway.start()
            await gateway.become_ready()
            try:
                yield Pod(prefill, decode, gateway)
            finally:
                await gateway.stop(grace_s=1.0)


async def register_fake_prefill(pod: Pod, address: str, **changes) -> None:
    """A registration of a prefill instance at `address` (nothing serves it)."""
    info = dataclasses.replace(pod.prefill.runtime.info(), instance_id=f"fake-{address.replace(':', '-')}", grpc_address=address,
                               ucx_address="127.0.0.1:1", **changes)
    client = connect_async(pod.prefill.runtime.settings.redis_url)
    try:
        await InstanceRegistry(client, pod.prefill.runtime.presence.namespace, ttl_s=60).register(info, InstanceLoad())
    finally:
        await client.aclose()


def test_the_named_prefill_instance_computes_the_prompt_and_the_tokens_are_the_gateways(
        redis_server, tiny_llama_folder, smollm2_tokenizer):  # noqa: F811
    async def scenario():
        async with pod(tiny_llama_folder, redis_server.url, smollm2_tokenizer) as p:
            for seed, header in enumerate(("x-gateway-prefill-endpoints", "x-prefiller-host-port")):
                prompt = prompt_ids(PROMPT_LENGTH, seed)
                before = await p.computed()
                got = await complete(p.decode.runtime.openai_address, prompt, {header: p.prefill.runtime.grpc_address})
                after = await p.computed()
                assert (after[0] - before[0], after[1] - before[1]) == (PROMPT_LENGTH, 0)  # computed there, none here
                assert got["usage"]["prompt_tokens"] == PROMPT_LENGTH
                expected = await complete(p.gateway.http_address, prompt)
                assert len(tokens(expected)) == MAX_TOKENS
                assert tokens(got) == tokens(expected)
            assert p.outcomes == {"routed": 2}
    asyncio.run(scenario())


def test_without_a_usable_prefill_endpoint_the_decode_instance_computes_the_prompt(
        redis_server, tiny_llama_folder, smollm2_tokenizer):  # noqa: F811
    async def scenario():
        async with pod(tiny_llama_folder, redis_server.url, smollm2_tokenizer) as p, silent_listener() as hung:
            # A hung instance is given up sooner here than the relay's defaults (stall 5 s, probe 2 s).
            p.decode.runtime.openai.state.relay.hang = HangTimeouts(control_call_s=10.0, stall_s=0.3,
                                                                   health_probe_s=0.3)
            down, older = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
            await register_fake_prefill(p, down)  # registered, nothing listening: the prefill call fails
            await register_fake_prefill(p, hung)  # registered, accepts connections, never answers
            await register_fake_prefill(p, older, kv_protocol_version=KV_PROTOCOL_VERSION + 1,
                                        pdserve_version="99.0")
            cases = [(None, None), ("unknown", f"127.0.0.1:{free_port()}"), ("malformed", "no-port"),
                     ("failed", down), ("failed", hung), ("incompatible", older),
                     ("not_prefill", p.decode.runtime.grpc_address)]
            for seed, (outcome, endpoint) in enumerate(cases):
                prompt = prompt_ids(PROMPT_LENGTH, 10 + seed)
                headers = {"x-gateway-prefill-endpoints": endpoint} if endpoint else {}
                before = await p.computed()
                got = await complete(p.decode.runtime.openai_address, prompt, headers)
                after = await p.computed()
                assert (after[0] - before[0], after[1] - before[1]) == (0, PROMPT_LENGTH), outcome
                assert tokens(got) == tokens(await complete(p.gateway.http_address, prompt)), outcome
            assert p.outcomes == Counter(outcome for outcome, _ in cases if outcome)
    asyncio.run(scenario())


@contextlib.asynccontextmanager
async def silent_listener():
    """"host:port" of a TCP server that accepts connections and never sends a byte."""
    connections = []
    server = await asyncio.start_server(lambda reader, writer: connections.append(writer), "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in connections:
            writer.close()
        server.close()
        await server.wait_closed()


def test_the_door_lists_the_model_and_answers_health_and_metrics(redis_server, tiny_llama_folder,
                                                              smollm2_tokenizer):  # noqa: F811
    async def scenario():
        async with pod(tiny_llama_folder, redis_server.url, smollm2_tokenizer) as p:
            address = p.decode.runtime.openai_address
            models = await asyncio.to_thread(_get, address, "/v1/models")
            assert [card["id"] for card in json.loads(models)["data"]] == ["tiny"]
            assert json.loads(await asyncio.to_thread(_get, address, "/health")) == {"status": "serving"}
            metrics = (await asyncio.to_thread(_get, address, "/metrics")).decode()
            assert "pdserve:instance_info" in metrics
    asyncio.run(scenario())


def _get(address: str, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=TIMEOUT_S) as response:
        return response.read()
