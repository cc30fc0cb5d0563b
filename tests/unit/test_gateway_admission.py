"""Load shedding at the gateway (services.gateway.admission): while the requests waiting for a
first token fill `max_queued_per_instance` per live prompt instance, a new request is refused at
once with RESOURCE_EXHAUSTED / HTTP 429, a Retry-After and a message naming the limit, before
anything is reserved; once the waiting requests are gone, requests are admitted again."""

import asyncio

import grpc
import pytest

from services.gateway.admission import Admission, prompt_pool
from shared.cluster.instances import InstanceInfo, InstanceLoad
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import gateway_pb2_grpc
from tests.helpers.raw_http import assert_openai_error
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import Behaviour
from tests.unit.test_gateway_bad_input import apost
from tests.unit.test_openai_http import http_gateway, model, run, wait_until, with_pair  # noqa: F401

BODY = {"prompt": [1, 2, 3], "max_tokens": 2}


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def info(instance_id: str, role: str) -> InstanceInfo:
    return InstanceInfo(instance_id=instance_id, role=role, grpc_address="127.0.0.1:1", ucx_address="", model="m")


def test_the_prompt_pool_is_the_prefill_instances_else_the_colocated_ones():
    listing = [(info("p0", "prefill"), InstanceLoad(queue_depth=3, num_running_requests=1, num_prefilling=1)),
               (info("p1", "prefill"), InstanceLoad(queue_depth=2)),
               (info("d0", "decode"), InstanceLoad(queue_depth=9, num_running_requests=9)),
               (info("c0", "colocated"), InstanceLoad(queue_depth=7))]
    assert prompt_pool(listing) == (2, 6)
    assert prompt_pool(listing[2:]) == (1, 7)
    assert prompt_pool(listing[2:3]) == (0, 0)


def test_a_colocated_instances_decoding_requests_do_not_wait_for_a_first_token():
    busy = InstanceLoad(queue_depth=1, num_running_requests=30, num_prefilling=2)  # 28 of them decode
    assert prompt_pool([(info("c0", "colocated"), busy)]) == (1, 3)
    admission = Admission(max_queued_per_instance=16)
    admission.admit(*prompt_pool([(info("c0", "colocated"), busy)]))  # admitted: 3 of 16 wait


def test_requests_are_shed_at_the_limit_per_instance_and_admitted_once_one_gets_its_token():
    admission = Admission(max_queued_per_instance=2)
    tickets = [admission.admit(num_instances=2, pool_waiting=0) for _ in range(4)]
    with pytest.raises(Exception) as shed:
        admission.admit(num_instances=2, pool_waiting=0)
    assert shed.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_queued_per_instance=2" in shed.value.message and "limit is 4" in shed.value.message
    assert admission.num_shed == 1
    tickets[0].first_token()
    tickets[0].release()  # after its first token, a request no longer counts
    admission.admit(num_instances=2, pool_waiting=0)
    assert admission.num_waiting == 4


def test_the_pools_heartbeats_count_when_they_see_more_than_this_gateway():
    admission = Admission(max_queued_per_instance=3)
    with pytest.raises(Exception):
        admission.admit(num_instances=1, pool_waiting=3)  # other gateways' requests fill the pool
    ticket = admission.admit(num_instances=2, pool_waiting=5)
    ticket.release()
    assert admission.num_waiting == 0


def test_nothing_is_shed_when_off_or_when_no_prompt_instance_is_live():
    assert Admission(0).admit(num_instances=1, pool_waiting=10**6) is not None
    admission = Admission(1)
    admission.admit(num_instances=0, pool_waiting=0)
    admission.admit(num_instances=0, pool_waiting=0)  # routing answers UNAVAILABLE instead
    assert admission.num_shed == 0


def test_retry_after_follows_the_recent_wait_for_a_first_token_and_is_at_least_a_second():
    clock = FakeClock()
    admission = Admission(max_queued_per_instance=1, clock=clock)
    assert admission.retry_after_s() == 1.0
    for _ in range(30):
        ticket = admission.admit(num_instances=1, pool_waiting=0)
        clock.now += 8.0
        ticket.first_token()
    assert 7.0 < admission.retry_after_s() <= 8.0
    admission.admit(num_instances=1, pool_waiting=0)
    with pytest.raises(Exception) as shed:
        admission.admit(num_instances=1, pool_waiting=0)
    assert shed.value.retry_after_s == admission.retry_after_s()
    assert "retry after 8 s" in shed.value.message


def test_release_without_a_first_token_frees_the_slot_once():
    admission = Admission(max_queued_per_instance=1)
    ticket = admission.admit(num_instances=1, pool_waiting=0)
    ticket.release()
    ticket.release()
    ticket.first_token()
    assert (admission.num_waiting, admission.recent_wait_s) == (0, 1.0)


def test_a_full_pool_sheds_with_429_and_resource_exhausted_and_reserves_nothing(redis_server, model):
    """Two requests wait in a prefill that holds them; the third is shed on both front doors;
    once the two are cancelled their reservations are given back and requests pass again."""
    async def scenario():
        async with http_gateway(redis_server.url, model, max_queued_per_instance=2) as gate:
            p0, d0 = await with_pair(gate, prefill_behaviour=Behaviour(prefill_blocks=True))
            channel = grpc.aio.insecure_channel(gate.server.address)
            stub = gateway_pb2_grpc.GatewayStub(channel)
            request = gw.GenerateRequest(token_ids=gw.TokenIds(ids=[1, 2, 3]))
            waiting = [asyncio.create_task(stub.Generate(request).read()) for _ in range(2)]
            await wait_until(lambda: sum(name == "StreamPrefill" for name, _ in p0.calls) == 2)

            status, body, headers = await apost(gate.server.http_address, "/v1/completions", BODY)
            assert_openai_error(status, body, 429)
            assert "max_queued_per_instance" in body["error"]["message"]
            assert int(headers["retry-after"]) >= 1
            with pytest.raises(grpc.aio.AioRpcError) as shed:
                await stub.Generate(request).read()
            assert shed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_queued_per_instance=2" in shed.value.details()
            assert int(dict(shed.value.trailing_metadata())["retry-after"]) >= 1
            assert sum(name == "Reserve" for name, _ in d0.calls) == 2  # the shed ones reserved nothing

            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            await wait_until(lambda: sum(name == "Release" for name, _ in d0.calls) == 2)
            await wait_until(lambda: gate.server.state.admission.num_waiting == 0)
            p0.behaviour.prefill_blocks = False
            replies = [m async for m in stub.Generate(request)]
            assert replies[-1].usage.completion_tokens == 3
            assert gate.server.state.admission.num_shed == 2
            await channel.close()
    run(scenario)
