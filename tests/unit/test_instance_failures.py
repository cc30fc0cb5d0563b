"""An instance under failure, in-process (real grpc.aio, real redis-server, tiny model):

  * a request whose own computation fails gets INTERNAL and every other request is served;
  * the engine failing as a whole makes the instance NOT_SERVING and leaves the Redis registry
    at once (and the entry exits non-zero), instead of staying registered answering 503;
  * a reservation whose caller is gone by the time it is made is freed at once, and a prefill
    cancelled during its KV transfer frees its held blocks at once.
"""

import asyncio
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import services.common.entry as entry
import services.decode
from services.common.runtime import InstanceRuntime
import shared.sampling.sampler as sampler_module
from services.common.errors import ServiceError
from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.errors import REQUEST_FAILED_METADATA_KEY
from shared.pb.pdserve.v1 import generation_pb2 as gen_pb
from shared.pb.pdserve.v1 import instance_pb2 as pb
from shared.pb.pdserve.v1.instance_pb2_grpc import InstanceStub
from tests.helpers.redis_server import connect_async
from tests.unit.test_instance_services import (
    DEPLOYMENT, NUM_BLOCKS, TIMEOUT_S, expect_status, fresh_ucx, greedy, make_settings, prefill_and_decode,
    prefill_request, prompt_ids, reserve, running, wait_until)

__all__ = ["fresh_ucx"]  # the autouse fixture, re-exported for this module's tests
POISON_SEED = 777


def generate(instance, request_id: str, prompt, sampling):
    return instance.stub.Generate(pb.InstanceGenerateRequest(request_id=request_id, prompt_token_ids=prompt,
                                                             sampling=sampling), timeout=TIMEOUT_S)


async def tokens_of(call) -> list[int]:
    return [token async for message in call for token in message.token_ids]


def test_a_failing_request_gets_internal_and_the_others_are_served(redis_server, tiny_llama_folder, monkeypatch):
    real = sampler_module.apply_history

    def failing(logits, rows):
        if any(row.params.seed == POISON_SEED and row.output_token_ids for row in rows):
            raise IndexError("index -1 is out of bounds for dimension 1 with size 256 (injected)")
        return real(logits, rows)
    monkeypatch.setattr(sampler_module, "apply_history", failing)

    async def scenario():
        async with running(make_settings("colocated", tiny_llama_folder, redis_server.url)) as colocated:
            poisoned = gen_pb.SamplingParams(temperature=1.0, max_tokens=8, seed=POISON_SEED, ignore_eos=True)
            bad = generate(colocated, "bad", prompt_ids(20, 1), poisoned)
            good = [generate(colocated, f"good{i}", prompt_ids(20, 2 + i), greedy(8)) for i in range(3)]
            results = await asyncio.gather(tokens_of(bad), *map(tokens_of, good), return_exceptions=True)
            assert isinstance(results[0], grpc.aio.AioRpcError)
            assert results[0].code() == grpc.StatusCode.INTERNAL
            assert results[0].details().startswith("request failed in the engine: sampling failed: IndexError")
            assert dict(results[0].trailing_metadata())[REQUEST_FAILED_METADATA_KEY] == "1"
            assert [len(tokens) for tokens in results[1:]] == [8, 8, 8]
            after = await tokens_of(generate(colocated, "after", prompt_ids(20, 9), greedy(4)))
            assert len(after) == 4
            assert colocated.runtime.engine.is_alive
    asyncio.run(scenario())


def test_an_engine_failure_leaves_the_pool_and_reports_not_serving(redis_server, tiny_llama_folder, monkeypatch):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, ClusterNamespace(DEPLOYMENT, tiny_llama_folder.name))
        runtime = InstanceRuntime(make_settings("colocated", tiny_llama_folder, redis_server.url),
                                  services.decode.build_handlers)
        try:
            await runtime.start()
            await wait_until(lambda: registry.list_live())

            def dead_worker(*args, **kwargs):
                raise RuntimeError("CUDA error: an illegal memory access (injected)")
            monkeypatch.setattr(runtime.engine.transport.core.executor.runner, "model", dead_worker)  # fault injection
            async with grpc.aio.insecure_channel(runtime.grpc_address) as channel:
                call = InstanceStub(channel).Generate(pb.InstanceGenerateRequest(
                    request_id="doomed", prompt_token_ids=prompt_ids(10, 3), sampling=greedy(4)), timeout=TIMEOUT_S)
                await expect_status(tokens_of(call), grpc.StatusCode.UNAVAILABLE, "engine failed")
                await asyncio.wait_for(runtime.failed.wait(), TIMEOUT_S)
                reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
                assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert await registry.list_live() == []
        finally:
            await runtime.stop()
            await client.aclose()
    asyncio.run(scenario())


def test_the_entry_exits_non_zero_after_an_engine_failure(monkeypatch):
    stopped = []

    class FailingRuntime:
        def __init__(self, settings, build_handlers):
            self.failed = asyncio.Event()

        async def start(self):
            self.failed.set()

        async def stop(self):
            stopped.append(True)
    monkeypatch.setattr(entry, "InstanceRuntime", FailingRuntime)
    monkeypatch.setattr(entry, "serve_until_signalled", entry.serve_until_signalled)
    settings = make_settings("colocated", "unused", "redis://127.0.0.1:1", instance_id="x")
    with pytest.raises(entry.EngineFailedError):
        asyncio.run(entry.serve_until_signalled(settings, lambda runtime: None))
    assert stopped == [True]


def test_a_reservation_whose_caller_is_gone_is_freed_at_once(redis_server, tiny_llama_folder):
    async def scenario():
        async with running(make_settings("decode", tiny_llama_folder, redis_server.url)) as decode:
            handler = decode.runtime.handlers.decode
            request = pb.ReserveRequest(request_id="gone", prompt_token_ids=prompt_ids(40, 5), sampling=greedy())
            with pytest.raises(ServiceError) as caught:
                await handler.reserve(request, caller_is_gone=lambda: True)
            assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            status = await decode.status()
            assert (status.num_reserved, status.num_free_blocks) == (0, NUM_BLOCKS)
            assert len(handler.leases) == 0
    asyncio.run(scenario())


def test_cancelling_a_prefill_during_its_kv_transfer_frees_both_sides_at_once(redis_server, tiny_llama_folder):
    prompt = prompt_ids(40, 6)

    async def scenario():
        async with prefill_and_decode(tiny_llama_folder, redis_server.url) as (prefill, decode):
            sending = threading.Event()  # set on the KV connector's transfer thread

            async def stuck_send(*args, **kwargs):
                sending.set()
                await asyncio.sleep(3600)
            prefill.runtime.engine.transport.core.connector.sender.send = stuck_send  # white box: a send that hangs
            reserved = await reserve(decode, "mid-transfer", prompt, greedy(4))
            call = prefill.stub.Prefill(prefill_request(reserved, "mid-transfer", prompt, sampling=greedy(4)),
                                        timeout=TIMEOUT_S)
            assert await asyncio.to_thread(sending.wait, TIMEOUT_S)
            assert (await prefill.status()).num_held == 1
            call.cancel()
            await wait_until(lambda: _status_if(prefill, lambda s: s.num_held == 0 and s.num_free_blocks == NUM_BLOCKS))
            assert (await decode.stub.Release(pb.ReleaseRequest(request_id="mid-transfer"))).released
            await wait_until(lambda: _status_if(decode, lambda s: s.num_reserved == 0 and s.num_free_blocks == NUM_BLOCKS))
    asyncio.run(scenario())


async def _status_if(instance, predicate):
    status = await instance.status()
    return status if predicate(status) else None
