"""An engine instance's Prometheus metrics and health, in process (tiny model, real Redis):
exact token and request counts after a few requests, the latency histograms a colocated
instance observes, and NOT_SERVING while the engine loads. KV transfer bytes by direction
are checked across real processes in tests/e2e/test_metrics_endpoints.py."""

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import services.instance.runtime as runtime_module
import services.decode
from services.instance.runtime import InstanceRuntime
from services.instance.settings import InstanceSettings
from shared.errors import ConfigurationError
from shared.kv_transfer.ucx.lifecycle import reset_ucx
from shared.pb.pdserve.v1 import instance_pb2 as pb
from tests.unit.metrics_scrape import labels_of, scrape, value
from tests.unit.test_instance_services import greedy, make_settings, prompt_ids, running


@pytest.fixture(autouse=True)
def fresh_ucx():
    yield
    reset_ucx()


async def generate(instance, request_id: str, prompt: list[int], max_tokens: int) -> list[int]:
    call = instance.stub.Generate(pb.InstanceGenerateRequest(
        request_id=request_id, prompt_token_ids=prompt, sampling=greedy(max_tokens)))
    return [token for message in [m async for m in call] for token in message.token_ids]


def test_colocated_metrics_count_exactly_the_requests_served(redis_server, tiny_llama_folder):
    first, second = prompt_ids(20, 1), prompt_ids(37, 2)

    async def scenario():
        settings = make_settings("colocated", tiny_llama_folder, redis_server.url, metrics_port=0,
                                 served_model_name="tiny", instance_id="colo-1")
        async with running(settings) as colocated:
            assert len(await generate(colocated, "a", first, 5)) == 5
            assert len(await generate(colocated, "b", second, 3)) == 3
            assert len(await generate(colocated, "c", second, 2)) == 2  # 32 of 37 from the prefix cache
            samples = scrape(colocated.runtime.metrics_address)
            assert value(samples, "vllm:prompt_tokens_total") == 20 + 37 + 37
            assert value(samples, "pdserve:prompt_tokens_computed_total") == 20 + 37 + 5
            assert value(samples, "vllm:generation_tokens_total") == 5 + 3 + 2
            assert value(samples, "vllm:prefix_cache_queries_total") == 20 + 37 + 37
            assert value(samples, "vllm:prefix_cache_hits_total") == 32
            assert value(samples, "vllm:request_success_total", finished_reason="length") == 3
            assert value(samples, "vllm:time_to_first_token_seconds_count") == 3
            assert value(samples, "vllm:request_queue_time_seconds_count") == 3
            assert value(samples, "vllm:e2e_request_latency_seconds_count") == 3
            assert value(samples, "vllm:inter_token_latency_seconds_count") == 4 + 2 + 1
            assert value(samples, "vllm:request_generation_tokens_sum") == 10
            assert value(samples, "vllm:num_requests_running") == value(samples, "vllm:num_requests_waiting") == 0
            assert value(samples, "vllm:kv_cache_usage_perc") == 0.0
            assert labels_of(samples, "vllm:lora_requests_info") == [
                {"model_name": "tiny", "role": "colocated", "instance_id": "colo-1", "max_lora": "0",
                 "running_lora_adapters": "", "waiting_lora_adapters": ""}]
            assert value(samples, "vllm:num_preemptions_total") == 0
            assert value(samples, "vllm:spec_decode_num_drafts_total") == 0  # no speculative decoding
            assert value(samples, "pdserve:kv_transfer_bytes_total", direction="sent") == 0
            assert value(samples, "pdserve:kv_transfer_bytes_total", direction="received") == 0
            assert value(samples, "pdserve:kv_transfer_idle_endpoints") == 0  # a colocated instance sends nothing
            assert value(samples, "pdserve:kv_transfer_lingering_operations") == 0
            assert labels_of(samples, "pdserve:instance_info") == [
                {"model_name": "tiny", "role": "colocated", "instance_id": "colo-1"}]
            assert "process_resident_memory_bytes" in {name for name, _ in samples}
    asyncio.run(scenario())


def test_health_is_not_serving_while_the_engine_loads(redis_server, tiny_llama_folder, monkeypatch):
    never_loads = asyncio.Event()

    async def stuck_start_engine(settings):
        await never_loads.wait()

    monkeypatch.setattr(runtime_module, "start_engine", stuck_start_engine)

    async def scenario():
        runtime = InstanceRuntime(make_settings("decode", tiny_llama_folder, redis_server.url),
                                  services.decode.build_handlers)
        starting = asyncio.create_task(runtime.start())
        try:
            while not runtime.grpc_address:
                await asyncio.sleep(0.01)
            async with grpc.aio.insecure_channel(runtime.grpc_address) as channel:
                health = health_pb2_grpc.HealthStub(channel)
                for service in ("", "pdserve.v1.Instance"):
                    reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                    assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        finally:
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await runtime.stop()
    asyncio.run(scenario())


def test_metrics_are_off_unless_a_port_is_given():
    assert InstanceSettings().metrics_port == -1
    with pytest.raises(ConfigurationError, match="metrics_port"):
        InstanceSettings(metrics_port=-2)
