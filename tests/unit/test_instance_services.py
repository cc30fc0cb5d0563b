"""Prefill, decode and colocated instance services, in-process: real grpc.aio servers on
ephemeral ports, a real redis-server, real UCX over loopback, the tiny random-weight model.

Every instance is checked on the way out: no request left and every KV block free again.
"""

import asyncio
import contextlib
import time
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import services.decode
import services.prefill
from services.common.grpc_server import INSTANCE_SERVICE_NAME
from services.common.runtime import InstanceRuntime
from services.common.settings import InstanceSettings
from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.cluster.lease_mirror import list_mirrored_leases
from shared.cluster.prefix_index import PrefixIndex
from shared.engine import LLM, SamplingParams
from shared.engine_api.client import CacheSettings
from shared.kv_cache.block_hash import HashRecipe, prompt_block_hashes
from shared.kv_cache.blocks import blocks_for_tokens
from shared.pb.pdserve.v1 import generation_pb2 as gen_pb, instance_pb2 as pb
from shared.pb.pdserve.v1.instance_pb2_grpc import InstanceStub
from shared.transfer.ucx_lifecycle import reset_ucx
from tests.helpers.redis_server import connect_async

BLOCK_SIZE = 16
NUM_BLOCKS = 32
DEPLOYMENT = "unit"
TIMEOUT_S = 20.0


# ---- harness ---------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def fresh_ucx():
    """ucxx's context is bound to one event loop; each test runs its own, so reset after it.
    (The reset clears the context even when pytest's captured log records still reference an
    endpoint through an exception, in which case it only warns.)"""
    yield
    reset_ucx()


def make_settings(role: str, folder, redis_url: str, **overrides) -> InstanceSettings:
    values = dict(role=role, model=str(folder), dtype="float32", grpc_port=0, redis_url=redis_url,
                  deployment=DEPLOYMENT, num_threads=1, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                  max_num_seqs=8, max_num_batched_tokens=256, heartbeat_interval_s=0.1,
                  heartbeat_ttl_s=1.0, prefix_publish_interval_s=0.05, shutdown_grace_s=1.0,
                  kv_host_tier_gb=0,  # no host tier: each test sees only what its own instances computed
                  # fault injection reaches into the engine; process cores: test_engine_core_crash
                  engine_core="thread")
    return InstanceSettings(**{**values, **overrides})


@dataclass
class Instance:
    runtime: InstanceRuntime
    stub: InstanceStub
    channel: grpc.aio.Channel

    async def status(self) -> pb.InstanceStatus:
        return await self.stub.GetStatus(pb.StatusRequest(), timeout=TIMEOUT_S)


async def wait_until(condition, timeout_s: float = TIMEOUT_S, interval_s: float = 0.02):
    """Poll an async condition until it returns something truthy; return that."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (result := await condition()):
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(interval_s)
    return result


async def assert_everything_freed(instance: Instance) -> None:
    async def is_idle():
        status = await instance.status()
        idle = (status.num_free_blocks == status.num_total_blocks and status.num_reserved == 0
                and status.num_running == status.num_waiting == status.num_held == 0)
        return status if idle else None
    status = await wait_until(is_idle, timeout_s=5.0)
    assert status.num_total_blocks == instance.runtime.engine.info.num_blocks


@contextlib.asynccontextmanager
async def running(settings: InstanceSettings):
    build = services.prefill.build_handlers if settings.role == "prefill" else services.decode.build_handlers
    runtime = InstanceRuntime(settings, build)
    try:
        await runtime.start()
        async with grpc.aio.insecure_channel(runtime.grpc_address) as channel:
            instance = Instance(runtime, InstanceStub(channel), channel)
            yield instance
            await assert_everything_freed(instance)
    finally:
        await runtime.stop()


@contextlib.asynccontextmanager
async def prefill_and_decode(folder, redis_url: str, prefill_overrides=None, decode_overrides=None):
    async with running(make_settings("prefill", folder, redis_url, **(prefill_overrides or {}))) as prefill:
        async with running(make_settings("decode", folder, redis_url, **(decode_overrides or {}))) as decode:
            yield prefill, decode


def prompt_ids(length: int, seed: int) -> list[int]:
    """Token ids in [3, 256): no BOS/EOS, deterministic per seed."""
    return [3 + (seed * 7919 + i * 104729 + (i * i) % 31) % 253 for i in range(length)]


def greedy(max_tokens: int = 8, **extra) -> gen_pb.SamplingParams:
    return gen_pb.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **extra)


@pytest.fixture
def offline(tiny_llama_folder):
    """A fresh offline engine on the same folder and dtype: the reference outputs."""
    return LLM(model=str(tiny_llama_folder), dtype="float32", num_blocks=NUM_BLOCKS, max_num_seqs=8,
               max_num_batched_tokens=256, num_threads=1)


def offline_output(llm: LLM, prompt: list[int], **params):
    [output] = llm.generate([prompt], SamplingParams(**params))
    return output


@dataclass
class DisaggregatedRun:
    reserved: pb.ReserveResponse
    prefilled: pb.PrefillResponse
    messages: list[gen_pb.GenerateResponse]

    @property
    def token_ids(self) -> list[int]:
        return [token for message in self.messages for token in message.token_ids]


async def reserve(decode: Instance, request_id: str, prompt: list[int], sampling, lease_ms: int = 0):
    return await decode.stub.Reserve(pb.ReserveRequest(request_id=request_id, prompt_token_ids=prompt,
                                                       sampling=sampling, lease_ms=lease_ms), timeout=TIMEOUT_S)


def prefill_request(reserved: pb.ReserveResponse, request_id: str, prompt: list[int], **changes) -> pb.PrefillRequest:
    fields = dict(request_id=request_id, prompt_token_ids=prompt, sampling=greedy(3),
                  decode_ucx_address=reserved.ucx_address, dst_block_ids=list(reserved.block_ids),
                  num_skip_blocks=reserved.num_skip_blocks,
                  transfer_token=reserved.transfer_token)
    return pb.PrefillRequest(**{**fields, **changes})


async def prefill_into(prefill: Instance, reserved: pb.ReserveResponse, request_id: str, prompt: list[int],
                       sampling, dst_block_ids=None) -> pb.PrefillResponse:
    changes = {"sampling": sampling} if dst_block_ids is None else {"sampling": sampling, "dst_block_ids": dst_block_ids}
    return await prefill.stub.Prefill(prefill_request(reserved, request_id, prompt, **changes), timeout=TIMEOUT_S)


def decode_request(request_id: str, prefilled: pb.PrefillResponse) -> pb.DecodeRequest:
    request = pb.DecodeRequest(request_id=request_id, first_token_id=prefilled.first_token_id)
    if prefilled.HasField("first_logprobs"):
        request.first_logprobs.CopyFrom(prefilled.first_logprobs)
    return request


async def run_disaggregated(prefill: Instance, decode: Instance, request_id: str, prompt: list[int],
                            sampling) -> DisaggregatedRun:
    reserved = await reserve(decode, request_id, prompt, sampling)
    prefilled = await prefill_into(prefill, reserved, request_id, prompt, sampling)
    messages = [m async for m in decode.stub.Decode(decode_request(request_id, prefilled), timeout=TIMEOUT_S)]
    return DisaggregatedRun(reserved, prefilled, messages)


async def expect_status(call, code: grpc.StatusCode, details_prefix: str = "") -> str:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == code, raised.value.details()
    assert raised.value.details().startswith(details_prefix), raised.value.details()
    return raised.value.details()


def bytes_per_block(instance: Instance) -> int:
    info = instance.runtime.engine.info
    return info.kv_pool_bytes // info.num_blocks


# ---- the disaggregated path --------------------------------------------------------------------

def test_reserve_prefill_decode_gives_the_offline_engines_tokens(redis_server, tiny_llama_folder, offline):
    prompts = {"short": prompt_ids(5, 1), "one-block": prompt_ids(16, 2), "three-blocks": prompt_ids(37, 3)}

    async def scenario():
        async with prefill_and_decode(tiny_llama_folder, redis_server.url) as (prefill, decode):
            for request_id, prompt in prompts.items():
                run = await run_disaggregated(prefill, decode, request_id, prompt,
                                              greedy(10, logprobs=2, prompt_logprobs=1))
                expected = offline_output(offline, prompt, temperature=0.0, max_tokens=10, ignore_eos=True,
                                          logprobs=2, prompt_logprobs=1)
                assert run.token_ids == expected.token_ids
                assert [e.token_id for e in run.prefilled.prompt_logprobs] == prompt[1:]
                assert [e.logprob for e in run.prefilled.prompt_logprobs] == pytest.approx(
                    [e.logprob for e in expected.prompt_logprobs], abs=1e-4)
                got_logprobs = [entry.logprob for message in run.messages for entry in message.logprobs]
                assert got_logprobs == pytest.approx([e.logprob for e in expected.outputs[0].logprobs], abs=1e-4)
                num_blocks = blocks_for_tokens(len(prompt), BLOCK_SIZE)
                assert len(run.reserved.block_ids) == num_blocks
                assert run.prefilled.num_computed_prompt_tokens == len(prompt)
                assert run.prefilled.kv_bytes_sent == num_blocks * bytes_per_block(decode)
                last = run.messages[-1]
                assert last.finish_reason == gen_pb.FINISH_REASON_LENGTH
                assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(prompt), 10)
            decode_status, prefill_status = await decode.status(), await prefill.status()
            assert decode_status.num_requests_finished == 3 and decode_status.role == "decode"
            assert decode_status.kv_bytes_transferred == prefill_status.kv_bytes_transferred > 0
            assert prefill_status.num_prompt_tokens_computed == sum(map(len, prompts.values()))
            assert decode_status.num_prompt_tokens_computed == 0  # the decode side never ran a prompt
    asyncio.run(scenario())


def test_decode_prefix_cache_hits_are_not_sent_again(redis_server, tiny_llama_folder, offline):
    first = prompt_ids(40, 4)
    second = first[:32] + prompt_ids(10, 5)

    async def scenario():
        async with prefill_and_decode(tiny_llama_folder, redis_server.url) as (prefill, decode):
            await run_disaggregated(prefill, decode, "first", first, greedy(4))
            run = await run_disaggregated(prefill, decode, "second", second, greedy(6))
            assert (run.reserved.num_cached_prompt_tokens, run.reserved.num_skip_blocks) == (32, 2)
            assert run.prefilled.kv_bytes_sent == 1 * bytes_per_block(decode)  # 3 blocks, 2 already there
            assert (run.prefilled.num_cached_prompt_tokens, run.prefilled.num_computed_prompt_tokens) == (32, 10)
            assert run.messages[-1].usage.cached_prompt_tokens == 32
            offline_output(offline, first, temperature=0.0, max_tokens=4, ignore_eos=True)
            expected = offline_output(offline, second, temperature=0.0, max_tokens=6, ignore_eos=True)
            assert run.token_ids == expected.token_ids
            status = await decode.status()
            assert status.num_cached_prompt_tokens == 32
    asyncio.run(scenario())


def test_a_prefill_with_no_destination_scores_the_prompt_and_sends_nothing(redis_server, tiny_llama_folder,
                                                                          offline):
    prompt = prompt_ids(37, 8)

    async def scenario():
        async with running(make_settings("prefill", tiny_llama_folder, redis_server.url)) as prefill:
            request = pb.PrefillRequest(request_id="scored", prompt_token_ids=prompt,
                                        sampling=greedy(1, prompt_logprobs=1))
            prefilled = await prefill.stub.Prefill(request, timeout=TIMEOUT_S)
            expected = offline_output(offline, prompt, temperature=0.0, max_tokens=1, ignore_eos=True,
                                      prompt_logprobs=1)
            assert [e.token_id for e in prefilled.prompt_logprobs] == prompt[1:]
            assert [e.logprob for e in prefilled.prompt_logprobs] == pytest.approx(
                [e.logprob for e in expected.prompt_logprobs], abs=1e-4)
            assert (prefilled.first_token_id, prefilled.kv_bytes_sent) == (expected.token_ids[0], 0)
            await assert_everything_freed(prefill)
    asyncio.run(scenario())


def test_a_failed_transfer_re_arms_the_receiver_for_a_retried_prefill(redis_server, tiny_llama_folder, offline):
    prompt = prompt_ids(35, 6)

    async def scenario():
        async with prefill_and_decode(tiny_llama_folder, redis_server.url) as (prefill, decode):
            reserved = await reserve(decode, "retried", prompt, greedy(5))
            wrong_blocks = list(reversed(reserved.block_ids))
            details = await expect_status(prefill_into(prefill, reserved, "retried", prompt, greedy(5), wrong_blocks),
                                          grpc.StatusCode.ABORTED)
            assert "dst_block_ids" in details
            await assert_everything_freed(prefill)  # the failed prefill released its blocks
            prefilled = await prefill_into(prefill, reserved, "retried", prompt, greedy(5))
            messages = [m async for m in decode.stub.Decode(decode_request("retried", prefilled), timeout=TIMEOUT_S)]
            expected = offline_output(offline, prompt, temperature=0.0, max_tokens=5, ignore_eos=True)
            assert [t for m in messages for t in m.token_ids] == expected.token_ids
    asyncio.run(scenario())


def test_a_prefill_past_its_deadline_releases_its_blocks(redis_server, tiny_llama_folder):
    prompt = prompt_ids(24, 15)

    async def scenario():
        silent = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)  # accepts, never answers
        stuck_decode = pb.ReserveResponse(ucx_address=f"127.0.0.1:{silent.sockets[0].getsockname()[1]}",
                                          block_ids=[0, 1])
        async with running(make_settings("prefill", tiny_llama_folder, redis_server.url)) as prefill:
            call = prefill.stub.Prefill(prefill_request(stuck_decode, "stuck", prompt), timeout=0.5)
            await expect_status(call, grpc.StatusCode.DEADLINE_EXCEEDED)
            await assert_everything_freed(prefill)
            status = await prefill.status()
            assert (status.num_prompt_tokens_computed, status.num_requests_finished) == (len(prompt), 1)
        silent.close()
    asyncio.run(scenario())


# ---- admission, leases, release, cancellation ----------------------------------------------------

def test_reserve_refuses_with_resource_exhausted_when_full(redis_server, tiny_llama_folder):
    prompt = prompt_ids(40, 7)  # 3 blocks each; 8 blocks hold two reservations

    async def scenario():
        async with running(make_settings("decode", tiny_llama_folder, redis_server.url, num_blocks=8)) as decode:
            for request_id in ("a", "b"):
                await reserve(decode, request_id, prompt, greedy(4))
            await expect_status(reserve(decode, "c", prompt, greedy(4)), grpc.StatusCode.RESOURCE_EXHAUSTED, "no room")
            assert (await decode.status()).num_reserved == 2
            for request_id in ("a", "b"):
                assert (await decode.stub.Release(pb.ReleaseRequest(request_id=request_id))).released
        async with running(make_settings("decode", tiny_llama_folder, redis_server.url, max_num_seqs=1)) as decode:
            await reserve(decode, "a", prompt, greedy(4))
            await expect_status(reserve(decode, "b", prompt, greedy(4)), grpc.StatusCode.RESOURCE_EXHAUSTED)
            await decode.stub.Release(pb.ReleaseRequest(request_id="a"))
    asyncio.run(scenario())


def test_release_frees_blocks_and_unknown_ids_are_not_found(redis_server, tiny_llama_folder):
    async def scenario():
        async with running(make_settings("decode", tiny_llama_folder, redis_server.url)) as decode:
            reserved = await reserve(decode, "kept", prompt_ids(33, 8), greedy(4))
            assert (await decode.status()).num_free_blocks == NUM_BLOCKS - len(reserved.block_ids) == NUM_BLOCKS - 3
            namespace = decode.runtime.presence.namespace
            leases = await wait_until(lambda: list_mirrored_leases(decode.runtime.presence.redis, namespace))
            assert [(lease.request_id, lease.block_ids) for lease in leases] == [("kept", tuple(reserved.block_ids))]
            assert (await decode.stub.Release(pb.ReleaseRequest(request_id="kept"))).released
            assert (await decode.status()).num_free_blocks == NUM_BLOCKS
            await expect_status(decode.stub.Release(pb.ReleaseRequest(request_id="kept")), grpc.StatusCode.NOT_FOUND)
            decode_call = decode.stub.Decode(pb.DecodeRequest(request_id="never", first_token_id=5), timeout=TIMEOUT_S).read()
            await expect_status(decode_call, grpc.StatusCode.NOT_FOUND, "no reservation for 'never'")
            await wait_until(lambda: _no_leases_mirrored(decode))
    asyncio.run(scenario())


async def _no_leases_mirrored(instance: Instance) -> bool:
    return not await list_mirrored_leases(instance.runtime.presence.redis, instance.runtime.presence.namespace)


def test_an_expired_lease_frees_the_reservation(redis_server, tiny_llama_folder):
    async def scenario():
        async with running(make_settings("decode", tiny_llama_folder, redis_server.url)) as decode:
            await reserve(decode, "abandoned", prompt_ids(20, 9), greedy(4), lease_ms=150)
            assert (await decode.status()).num_reserved == 1
            status = await wait_until(lambda: _status_if(decode, lambda s: s.num_lease_expiries == 1))
            assert (status.num_reserved, status.num_free_blocks) == (0, NUM_BLOCKS)
            decode_call = decode.stub.Decode(pb.DecodeRequest(request_id="abandoned", first_token_id=5), timeout=TIMEOUT_S).read()
            await expect_status(decode_call, grpc.StatusCode.NOT_FOUND)
    asyncio.run(scenario())


def test_renewing_a_lease_keeps_the_reservation_past_its_first_expiry(redis_server, tiny_llama_folder):
    async def scenario():
        async with running(make_settings("decode", tiny_llama_folder, redis_server.url)) as decode:
            await reserve(decode, "queued", prompt_ids(20, 9), greedy(4), lease_ms=300)
            for _ in range(4):  # 0.8 s in all, well past the first 300 ms lease
                await asyncio.sleep(0.2)
                renewal = pb.RenewRequest(request_id="queued", lease_ms=300)
                assert (await decode.stub.Renew(renewal, timeout=TIMEOUT_S)).renewed
            status = await decode.status()
            assert (status.num_reserved, status.num_lease_expiries) == (1, 0)
            status = await wait_until(lambda: _status_if(decode, lambda s: s.num_lease_expiries == 1))
            assert (status.num_reserved, status.num_free_blocks) == (0, NUM_BLOCKS)
            await expect_status(decode.stub.Renew(pb.RenewRequest(request_id="queued")), grpc.StatusCode.NOT_FOUND)
    asyncio.run(scenario())


async def _status_if(instance: Instance, predicate):
    status = await instance.status()
    return status if predicate(status) else None


def test_a_reserve_past_its_deadline_leaves_nothing_reserved(redis_server, tiny_llama_folder):
    async def scenario():
        async with running(make_settings("decode", tiny_llama_folder, redis_server.url)) as decode:
            engine = decode.runtime.engine.transport.core  # a test double: this reservation takes past the deadline
            reserve_request = engine.reserve_request
            engine.reserve_request = lambda *args: (time.sleep(0.5), reserve_request(*args))[1]
            call = decode.stub.Reserve(pb.ReserveRequest(request_id="late", prompt_token_ids=prompt_ids(40, 17),
                                                         sampling=greedy()), timeout=0.2)
            await expect_status(call, grpc.StatusCode.DEADLINE_EXCEEDED)
            # Commands run in order: this one runs after the late reservation and its abort.
            await decode.runtime.engine.status()
            status = await decode.status()
            assert (status.num_reserved, status.num_free_blocks) == (0, NUM_BLOCKS)
            assert len(decode.runtime.handlers.decode.leases) == 0
    asyncio.run(scenario())


def test_decode_before_the_kv_arrived_is_a_failed_precondition(redis_server, tiny_llama_folder):
    prompt = prompt_ids(18, 10)

    async def scenario():
        async with prefill_and_decode(tiny_llama_folder, redis_server.url) as (prefill, decode):
            reserved = await reserve(decode, "early", prompt, greedy(3))
            early = decode.stub.Decode(pb.DecodeRequest(request_id="early", first_token_id=5), timeout=TIMEOUT_S).read()
            await expect_status(early, grpc.StatusCode.FAILED_PRECONDITION, "the KV of 'early' has not arrived")
            # (after waiting services.decode.leases.ARRIVAL_GRACE_S for an arrival the engine has not noted yet)
            prefilled = await prefill_into(prefill, reserved, "early", prompt, greedy(3))  # still reserved
            messages = [m async for m in decode.stub.Decode(decode_request("early", prefilled), timeout=TIMEOUT_S)]
            assert sum(len(m.token_ids) for m in messages) == 3
    asyncio.run(scenario())


def test_cancelling_a_decode_stream_frees_its_blocks(redis_server, tiny_llama_folder):
    prompt = prompt_ids(30, 11)

    async def scenario():
        async with prefill_and_decode(tiny_llama_folder, redis_server.url) as (prefill, decode):
            sampling = greedy(90)
            reserved = await reserve(decode, "cancelled", prompt, sampling)
            prefilled = await prefill_into(prefill, reserved, "cancelled", prompt, sampling)
            call = decode.stub.Decode(decode_request("cancelled", prefilled), timeout=TIMEOUT_S)
            first = await call.read()
            assert first.token_ids[0] == prefilled.first_token_id
            call.cancel()
            status = await wait_until(lambda: _status_if(decode, lambda s: s.num_free_blocks == NUM_BLOCKS))
            assert (status.num_running, status.num_requests_finished) == (0, 0)
    asyncio.run(scenario())


# ---- bad input, draining -----------------------------------------------------------------------

def test_invalid_requests_get_invalid_argument_naming_the_field(redis_server, tiny_llama_folder):
    prompt = prompt_ids(20, 12)

    async def scenario():
        async with running(make_settings("colocated", tiny_llama_folder, redis_server.url)) as colocated:
            stub = colocated.stub
            bad_temperature = gen_pb.SamplingParams(temperature=-1.0)
            await expect_status(reserve(colocated, "r", prompt, bad_temperature), grpc.StatusCode.INVALID_ARGUMENT,
                                "temperature")
            await expect_status(reserve(colocated, "r", [], greedy()), grpc.StatusCode.INVALID_ARGUMENT, "prompt")
            await expect_status(reserve(colocated, "r", [999], greedy()), grpc.StatusCode.INVALID_ARGUMENT, "prompt")
            reserved = await reserve(colocated, "ok", prompt, greedy(3))
            prefill_cases = [({"sampling": gen_pb.SamplingParams(top_p=1.5)}, "top_p"),
                             ({"sampling": gen_pb.SamplingParams(n=2)}, "n"),
                             ({"dst_block_ids": [1]}, "dst_block_ids"),
                             ({"num_skip_blocks": 2}, "num_skip_blocks"),
                             ({"decode_ucx_address": "nowhere"}, "decode_ucx_address"),
                             ({"prompt_token_ids": []}, "prompt_token_ids")]
            for changes, field in prefill_cases:
                request = prefill_request(reserved, "ok", prompt, **changes)
                await expect_status(stub.Prefill(request), grpc.StatusCode.INVALID_ARGUMENT, field)
            generate = stub.Generate(pb.InstanceGenerateRequest(request_id="g", prompt_token_ids=prompt,
                                                                sampling=gen_pb.SamplingParams(max_tokens=0))).read()
            await expect_status(generate, grpc.StatusCode.INVALID_ARGUMENT, "max_tokens")
            first_token = colocated.runtime.engine.info.vocab_size
            bad_decode = stub.Decode(pb.DecodeRequest(request_id="ok", first_token_id=first_token), timeout=TIMEOUT_S).read()
            await expect_status(bad_decode, grpc.StatusCode.INVALID_ARGUMENT, "first_token_id")
            run = await run_disaggregated(colocated, colocated, "after", prompt, greedy(3))  # nothing else affected
            assert len(run.token_ids) == 3
            assert (await stub.Release(pb.ReleaseRequest(request_id="ok"))).released
    asyncio.run(scenario())


def test_draining_refuses_new_work_and_reports_not_serving(redis_server, tiny_llama_folder):
    async def scenario():
        async with running(make_settings("colocated", tiny_llama_folder, redis_server.url)) as colocated:
            health = health_pb2_grpc.HealthStub(colocated.channel)
            for service in ("", INSTANCE_SERVICE_NAME):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            await colocated.runtime.begin_draining()
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            await expect_status(reserve(colocated, "late", prompt_ids(5, 1), greedy()), grpc.StatusCode.UNAVAILABLE,
                                "instance")
            generate = colocated.stub.Generate(pb.InstanceGenerateRequest(request_id="late", prompt_token_ids=[5]), timeout=TIMEOUT_S).read()
            await expect_status(generate, grpc.StatusCode.UNAVAILABLE)
            assert (await colocated.status()).role == "colocated"  # status still answers
    asyncio.run(scenario())


def test_a_decode_stream_in_flight_finishes_during_a_graceful_stop(redis_server, tiny_llama_folder, offline):
    prompt = prompt_ids(19, 16)

    async def scenario():
        runtime = InstanceRuntime(make_settings("colocated", tiny_llama_folder, redis_server.url, shutdown_grace_s=10.0),
                                  services.decode.build_handlers)
        await runtime.start()
        try:
            async with grpc.aio.insecure_channel(runtime.grpc_address) as channel:
                instance = Instance(runtime, InstanceStub(channel), channel)
                sampling = greedy(60)
                reserved = await reserve(instance, "draining", prompt, sampling)
                prefilled = await prefill_into(instance, reserved, "draining", prompt, sampling)
                call = instance.stub.Decode(decode_request("draining", prefilled), timeout=TIMEOUT_S)
                first = await call.read()
                stopping = asyncio.get_running_loop().create_task(runtime.stop())
                rest = []
                while (message := await call.read()) != grpc.aio.EOF:
                    rest.append(message)
                await stopping
            tokens = [t for m in [first, *rest] for t in m.token_ids]
            assert tokens == offline_output(offline, prompt, temperature=0.0, max_tokens=60, ignore_eos=True).token_ids
            assert runtime.engine.load().num_free_blocks == NUM_BLOCKS
        finally:
            await runtime.stop()
    asyncio.run(scenario())


def test_a_stopping_instance_is_registered_as_draining_until_its_work_is_done(redis_server, tiny_llama_folder):
    """stop() (what SIGTERM runs): while a granted reservation is outstanding the instance stays
    registered as DRAINING, with its load (`pdserve status` shows it), and no reader that hands
    out new work lists it; once the reservation is released it deregisters."""
    async def draining_records(registry):
        return [record for record in await registry.list_live(include_draining=True) if record[0].is_draining]

    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, ClusterNamespace(DEPLOYMENT, tiny_llama_folder.name))
        runtime = InstanceRuntime(make_settings("colocated", tiny_llama_folder, redis_server.url, drain_timeout_s=120.0),
                                  services.decode.build_handlers)
        await runtime.start()
        try:
            async with grpc.aio.insecure_channel(runtime.grpc_address) as channel:
                instance = Instance(runtime, InstanceStub(channel), channel)
                await wait_until(registry.list_live)
                await reserve(instance, "held", prompt_ids(23, 12), greedy(3))
                stopping = asyncio.get_running_loop().create_task(runtime.stop())
                [(info, load)] = await wait_until(lambda: draining_records(registry))
                assert info.instance_id == runtime.instance_id and info.state == "draining"
                assert load.queue_depth == 1  # the reservation it still holds
                assert await registry.list_live() == [] and not stopping.done()
                assert (await instance.stub.Release(pb.ReleaseRequest(request_id="held"))).released
                await stopping
            assert await registry.list_live(include_draining=True) == []
        finally:
            await runtime.stop()
            await client.aclose()
    asyncio.run(scenario())


# ---- colocated -----------------------------------------------------------------------------------

def test_colocated_generate_matches_offline_and_streams_n_completions(redis_server, tiny_llama_folder, offline):
    prompt = prompt_ids(21, 13)

    async def scenario():
        async with running(make_settings("colocated", tiny_llama_folder, redis_server.url)) as colocated:
            request = pb.InstanceGenerateRequest(request_id="g1", prompt_token_ids=prompt,
                                                 sampling=greedy(9, prompt_logprobs=1))
            messages = [m async for m in colocated.stub.Generate(request, timeout=TIMEOUT_S)]
            expected = offline_output(offline, prompt, temperature=0.0, max_tokens=9, ignore_eos=True, prompt_logprobs=1)
            assert [t for m in messages for t in m.token_ids] == expected.token_ids
            assert len(messages[0].prompt_logprobs) == len(prompt) - 1
            assert all(not m.prompt_logprobs for m in messages[1:])
            sampling = gen_pb.SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=5, ignore_eos=True)
            request = pb.InstanceGenerateRequest(request_id="g2", prompt_token_ids=prompt, sampling=sampling)
            messages = [m async for m in colocated.stub.Generate(request, timeout=TIMEOUT_S)]
            by_index = {i: [t for m in messages if m.index == i for t in m.token_ids] for i in (0, 1)}
            expected = offline_output(offline, prompt, n=2, temperature=1.0, seed=3, max_tokens=5, ignore_eos=True)
            assert by_index == {0: expected.outputs[0].token_ids, 1: expected.outputs[1].token_ids}
            assert messages[-1].usage.completion_tokens == 10
    asyncio.run(scenario())


# ---- Redis: registration, load, prefix index ----------------------------------------------------

def test_instances_register_with_load_and_publish_their_prefix_index(redis_server, tiny_llama_folder):
    prompt = prompt_ids(50, 14)  # 3 full blocks
    blake2b = {"prefix_hash_algo": "blake2b"}
    cache = CacheSettings(model_id=tiny_llama_folder.name, block_size=BLOCK_SIZE, prefix_hash_algo="blake2b",
                          dtype="float32", kv_layout="kv,layer,block,slot,kv_head,head_dim;layers=2;kv_heads=2;"
                                                     "head_dim=16", tensor_parallel_size=1)

    async def scenario():
        client = connect_async(redis_server.url)
        namespace = ClusterNamespace(DEPLOYMENT, tiny_llama_folder.name)
        registry, index = InstanceRegistry(client, namespace), PrefixIndex(client, namespace)
        async with prefill_and_decode(tiny_llama_folder, redis_server.url, blake2b, blake2b) as (prefill, decode):
            live = await wait_until(lambda: _live_if_both(registry))
            infos = {info.role: (info, load) for info, load in live}
            assert infos["prefill"][0].cache == infos["decode"][0].cache == cache
            assert infos["prefill"][0].grpc_address == prefill.runtime.grpc_address
            # With peer reuse (the default) a prefill instance receives the prefixes it pulls.
            assert infos["prefill"][0].ucx_address == prefill.runtime.ucx_address != ""
            assert infos["decode"][0].ucx_address == decode.runtime.ucx_address != ""
            assert all(load.num_total_blocks == load.num_free_blocks == NUM_BLOCKS for _, load in infos.values())
            reserved = await reserve(decode, "held", prompt, greedy(3))
            load = await wait_until(lambda: _decode_load_if(registry, lambda l: l.queue_depth == 1))
            assert load.num_free_blocks == NUM_BLOCKS - len(reserved.block_ids)
            await decode.stub.Release(pb.ReleaseRequest(request_id="held"))
            await run_disaggregated(prefill, decode, "indexed", prompt, greedy(3))
            hashes = prompt_block_hashes(prompt, HashRecipe(tiny_llama_folder.name, BLOCK_SIZE, "blake2b"))
            ids = {prefill.runtime.instance_id, decode.runtime.instance_id}
            held = await wait_until(lambda: _held_if_all(index, hashes, ids))
            assert held == {instance_id: 3 for instance_id in ids}
        assert await registry.list_live() == []
        assert await index.indexed_instance_ids() == set()
        await client.aclose()
    asyncio.run(scenario())


async def _live_if_both(registry: InstanceRegistry):
    live = await registry.list_live()
    return live if sorted(info.role for info, _ in live) == ["decode", "prefill"] else None


async def _decode_load_if(registry: InstanceRegistry, predicate):
    [(_, load)] = await registry.list_live("decode")
    return load if predicate(load) else None


async def _held_if_all(index: PrefixIndex, hashes, ids):
    held = await index.longest_prefix(hashes, ids)
    return held if all(count == len(hashes) for count in held.values()) else None
