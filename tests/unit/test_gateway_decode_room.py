"""Waiting for room on the decode pool (services.gateway.decode_room): a request that every
decode instance refuses for want of free KV blocks waits its turn, first come first served,
and is reserved once a completion frees room; only the head of the queue tries again; past
--max-room-wait-s (or its deadline) it fails RESOURCE_EXHAUSTED saying how long it waited.
With --max-room-wait-s 0 a refusal fails the request at once (test_gateway_service)."""

import asyncio

import grpc
import pytest

from services.gateway.decode_room import DecodeRoom
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import Behaviour, FakeInstance
from tests.unit.test_gateway_service import collect, gateway, generate_request, model, run  # noqa: F401


# ---- the queue --------------------------------------------------------------------------------

def test_only_the_head_tries_when_room_is_freed_and_the_next_one_when_the_head_leaves():
    async def scenario():
        room = DecodeRoom(recheck_s=60.0)
        first, second = room.join(), room.join()
        second_waits = asyncio.create_task(room.wait_turn(second, 60.0))
        first_waits = asyncio.create_task(room.wait_turn(first, 60.0))
        await asyncio.sleep(0)
        room.freed()  # a completion ended: the head tries, the second still waits
        assert await first_waits
        assert not second_waits.done()
        room.leave(first)  # the head got its reservation: the next one tries at once
        assert await second_waits
        room.leave(second)
        assert room.num_waiting == 0 and room.num_waited == 2
    asyncio.run(scenario())


def test_the_head_tries_again_every_recheck_and_a_wait_past_its_time_ends():
    async def scenario():
        room = DecodeRoom(recheck_s=0.01)
        head, behind = room.join(), room.join()
        assert await room.wait_turn(head, 60.0)  # no completion ended: the recheck lets it try
        assert not await room.wait_turn(behind, 0.05)  # never its turn within its time
        room.leave(behind)
        room.leave(head)
        assert room.num_waiting == 0
    asyncio.run(scenario())


# ---- through the gateway, on fake instances ----------------------------------------------------

def test_a_request_refused_for_room_waits_and_is_served_once_the_decode_has_room(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, max_room_wait_s=60) as gate:
            d0 = FakeInstance("d0", "decode", Behaviour(num_reserves_refused=2))
            await gate.add(FakeInstance("p0", "prefill"), d0)
            replies = await collect(gate.stub.Generate(generate_request()))
            assert replies[-1].usage.completion_tokens > 0
            assert d0.methods().count("Reserve") == 3  # refused twice, then granted
            relay = gate.server.state.relay
            assert (relay.room.num_waited, relay.room.num_waiting) == (1, 0)
            assert gate.stats.num_decode_refusals == 2 and not gate.stats.failures
    run(scenario)


def test_a_request_that_finds_no_room_in_time_fails_saying_how_long_it_waited(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, max_room_wait_s=0.2) as gate:
            full = Behaviour(reserve_error=grpc.StatusCode.RESOURCE_EXHAUSTED)
            await gate.add(FakeInstance("p0", "prefill"), FakeInstance("d0", "decode", full))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(gate.stub.Generate(generate_request()))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "no decode instance had free KV blocks for the request within the" in caught.value.details()
            assert "(max_room_wait_s=0.2, or its deadline)" in caught.value.details()
            assert gate.server.state.relay.room.num_waiting == 0
    run(scenario)
