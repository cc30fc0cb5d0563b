"""Instances whose engine core runs in a child process (`--engine-core process`), in-process
services otherwise (real grpc.aio, real redis-server, tiny model, UCX between the cores):

  * reserve -> prefill -> decode through two core processes gives the offline engine's tokens;
  * the core killed under a stream: the stream fails UNAVAILABLE at once, the instance turns
    NOT_SERVING and leaves the Redis registry, restarts its core, then serves and registers
    again; later requests succeed and every block is free;
  * a core that keeps crashing (past --max-engine-restarts) ends the instance (`failed`).
"""

import asyncio
import os
import signal

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import services.decode
from services.instance.runtime import InstanceRuntime
from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.pb.pdserve.v1 import instance_pb2 as pb
from shared.pb.pdserve.v1.instance_pb2_grpc import InstanceStub
from tests.helpers.redis_server import connect_async
from tests.unit.test_instance_failures import tokens_of
from tests.unit.test_instance_services import (
    DEPLOYMENT, TIMEOUT_S, assert_everything_freed, expect_status, fresh_ucx, greedy, make_settings,
    offline, offline_output, prompt_ids, run_disaggregated, running, wait_until)

__all__ = ["fresh_ucx", "offline"]  # fixtures, re-exported for this module's tests
IN_A_PROCESS = dict(engine_core="process")


def test_disaggregated_through_core_processes_gives_the_offline_engines_tokens(redis_server, tiny_llama_folder,
                                                                               offline):
    prompt = prompt_ids(37, 3)

    async def scenario():
        async with running(make_settings("prefill", tiny_llama_folder, redis_server.url, **IN_A_PROCESS)) as prefill:
            async with running(make_settings("decode", tiny_llama_folder, redis_server.url, **IN_A_PROCESS)) as decode:
                assert prefill.runtime.engine.pid != os.getpid()
                run = await run_disaggregated(prefill, decode, "r1", prompt, greedy(10, logprobs=1))
                expected = offline_output(offline, prompt, temperature=0.0, max_tokens=10, ignore_eos=True,
                                          logprobs=1)
                assert run.token_ids == expected.token_ids
                assert run.prefilled.kv_bytes_sent > 0
                assert (await decode.status()).num_requests_finished == 1
    asyncio.run(scenario())


async def health(channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    return reply.status


def test_a_killed_core_is_restarted_in_place_and_the_instance_serves_again(redis_server, tiny_llama_folder):
    async def scenario():
        client = connect_async(redis_server.url)
        registry = InstanceRegistry(client, ClusterNamespace(DEPLOYMENT, tiny_llama_folder.name))
        settings = make_settings("colocated", tiny_llama_folder, redis_server.url, **IN_A_PROCESS)
        try:
            async with running(settings) as colocated:
                runtime = colocated.runtime
                await wait_until(registry.list_live)
                left_the_pool = asyncio.Event()
                on_failure = runtime.engine.on_failure
                runtime.engine.on_failure = lambda error: (left_the_pool.set(), on_failure(error))
                call = colocated.stub.Generate(pb.InstanceGenerateRequest(
                    request_id="doomed", prompt_token_ids=prompt_ids(10, 3), sampling=greedy(100)), timeout=TIMEOUT_S)
                await anext(aiter(call))
                old_pid = runtime.engine.pid
                os.kill(old_pid, signal.SIGKILL)
                details = await expect_status(tokens_of(call), grpc.StatusCode.UNAVAILABLE, "engine failed")
                assert f"engine core process {old_pid} was killed by SIGKILL" in details
                await asyncio.wait_for(left_the_pool.wait(), TIMEOUT_S)
                await wait_until(lambda: _serving_with_a_new_core(colocated, old_pid), timeout_s=120)
                await wait_until(registry.list_live)
                assert not runtime.failed.is_set() and runtime.restart_budget.num_recent == 1
                after = await tokens_of(colocated.stub.Generate(pb.InstanceGenerateRequest(
                    request_id="after", prompt_token_ids=prompt_ids(10, 4), sampling=greedy(4)), timeout=TIMEOUT_S))
                assert len(after) == 4
                await assert_everything_freed(colocated)
        finally:
            await client.aclose()
    asyncio.run(scenario())


async def _serving_with_a_new_core(instance, old_pid: int) -> bool:
    engine = instance.runtime.engine
    if not engine.is_alive or engine.pid == old_pid:
        return False
    return await health(instance.channel) == health_pb2.HealthCheckResponse.SERVING


def test_a_crash_loop_past_the_restart_budget_ends_the_instance(redis_server, tiny_llama_folder):
    async def scenario():
        settings = make_settings("decode", tiny_llama_folder, redis_server.url, max_engine_restarts=0, **IN_A_PROCESS)
        runtime = InstanceRuntime(settings, services.decode.build_handlers)
        try:
            await runtime.start()
            os.kill(runtime.engine.pid, signal.SIGKILL)
            await asyncio.wait_for(runtime.failed.wait(), TIMEOUT_S)
            async with grpc.aio.insecure_channel(runtime.grpc_address) as channel:
                assert await health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
                await expect_status(InstanceStub(channel).GetStatus(pb.StatusRequest(), timeout=TIMEOUT_S),
                                    grpc.StatusCode.UNAVAILABLE)
        finally:
            await runtime.stop()
    asyncio.run(scenario())
