"""The gateway against instances that are alive but do not answer (a SIGSTOPped process tree),
on fake instances that stop answering calls and health probes: a stalled Decode stream
migrates once the decode instance leaves a probe unanswered, its call cancelled (the fence
that makes the instance free the request's blocks when it resumes); a Reserve that gets no
answer in control_call_timeout_s is tried on the other decode instance; a prefill stalled by a hung decode instance moves to another decode
instance; a hung prefill instance costs its reservation (a transfer stuck half-way) and the
completion starts over on a fresh one; a slow but live instance is probed and waited for.

The timeouts are set small here; they are the mechanism under test, and no assertion is on
how long anything took."""

import asyncio

import grpc
import pytest

from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import Behaviour, FakeInstance
from tests.unit.test_gateway_service import PROMPT_IDS, collect, gateway, generate_request, model, run  # noqa: F401

HANG = {"stall_timeout_s": 0.2, "health_probe_timeout_s": 0.2, "control_call_timeout_s": 0.3}


def _tokens(messages) -> list[int]:
    return [t for m in messages for t in m.token_ids]


def test_a_decode_hung_mid_stream_migrates_and_its_call_is_cancelled(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, **HANG) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode", Behaviour(decode_blocks_after_first=True))
            d1 = FakeInstance("d1", "decode")
            await gate.add(p0, d0, d1)
            d0.hang()
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=8)))
            # d0 streamed "Hello" ([42]) and hung; d1 continued after it (the fake restarts its text).
            assert _tokens(messages) == [42, 42, 43, 44]
            [reserve] = d1.requests_of("Reserve")
            assert list(reserve.prompt_token_ids) == PROMPT_IDS + [42] and reserve.num_resumed_output_tokens == 1
            await asyncio.wait_for(d0.cancelled.wait(), 5)  # the fence: d0's Decode call is cancelled
            assert gate.stats.migrations == {"hung": 1}
            assert gate.stats.hung_instances == {"decode": 1}
            assert messages[-1].usage.completion_tokens == 3 + 1
    run(scenario)


def test_a_decode_that_never_answers_its_decode_call_is_left_after_the_first_token(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, **HANG) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode")
            d1 = FakeInstance("d1", "decode")
            d0.Decode = _never_answering(d0)
            await gate.add(p0, d0, d1)
            d0.hang()
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=8)))
            # The client had the prefill's first token (42); d1 continued after it.
            assert _tokens(messages) == [42, 42, 43, 44]
            assert d1.methods() == ["Reserve", "Decode"]
            await asyncio.wait_for(d0.cancelled.wait(), 5)
            assert gate.stats.hung_instances == {"decode": 1} and gate.stats.migrations == {"hung": 1}
    run(scenario)


def _never_answering(fake: FakeInstance, method: str = "Decode"):
    async def decode(request, context):
        fake.calls.append((method, request))
        await fake._wait_for_cancel()
        yield  # pragma: no cover - never reached
    return decode


def test_a_reserve_left_unanswered_is_tried_on_the_other_decode(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, **HANG) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode", Behaviour(reserve_blocks=True))  # ranks first (instance id)
            d1 = FakeInstance("d1", "decode")
            await gate.add(p0, d0, d1)
            d0.hang()
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert _tokens(messages) == [42, 43, 44]
            assert d1.methods() == ["Reserve", "Decode"]
            assert gate.stats.hung_instances == {"decode": 1}
            await asyncio.wait_for(d0.cancelled.wait(), 5)  # the Reserve was given up, not left running
            # Its answer may have been lost after a grant: it is released, not left to its lease.
            await _wait_for(lambda: "Release" in d0.methods())
    run(scenario)


def test_reserves_that_no_decode_answered_are_tried_once_more_on_a_fresh_listing(redis_server, model):  # noqa: F811
    """Every decode instance leaves one Reserve unanswered (a pause, not a hang: they answer
    the next): the request is not failed for it, but served after a second round."""
    async def scenario():
        async with gateway(redis_server.url, model, **HANG) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode", Behaviour(num_reserves_unanswered=1))
            d1 = FakeInstance("d1", "decode", Behaviour(num_reserves_unanswered=1))
            await gate.add(p0, d0, d1)
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert _tokens(messages) == [42, 43, 44]
            assert [m for m, _ in d0.calls + d1.calls].count("Reserve") == 3
            assert gate.stats.num_reserve_rounds_repeated == 1
    run(scenario)


def test_a_request_fails_when_no_decode_answers_in_either_round(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, **HANG) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode", Behaviour(reserve_blocks=True))
            await gate.add(p0, d0)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "could be reached" in failure.value.details()
            assert d0.methods().count("Reserve") == 2
    run(scenario)


def test_a_hung_prefill_costs_its_reservation_and_the_completion_starts_over(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, **HANG) as gate:
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_blocks=True))  # ranks first
            p1 = FakeInstance("p1", "prefill")
            d0 = FakeInstance("d0", "decode")
            await gate.add(p0, p1, d0)
            p0.hang()
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert _tokens(messages) == [42, 43, 44]
            await asyncio.wait_for(p0.cancelled.wait(), 5)
            # The reservation p0 was sending into is given back (its transfer may be stuck
            # half-way); the completion starts over on a fresh one, under a new id, on p1.
            assert [r.request_id for r in p1.requests_of("StreamPrefill")] == ["r1@1"]
            await _wait_for(lambda: len(d0.methods()) == 4)
            assert sorted((m, r.request_id) for m, r in d0.calls) == [
                ("Decode", "r1@1"), ("Release", "r1"), ("Reserve", "r1"), ("Reserve", "r1@1")]
            assert gate.stats.hung_instances == {"prefill": 1} and gate.stats.migrations == {}
    run(scenario)


def test_a_prefill_stalled_by_a_hung_decode_moves_to_another_decode(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, **HANG) as gate:
            # The prefill instance is live but its KV cannot reach d0: its stream stalls.
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_blocks_toward="ucx-d0"))
            d0 = FakeInstance("d0", "decode")
            d1 = FakeInstance("d1", "decode")
            await gate.add(p0, d0, d1)
            d0.hang()
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert _tokens(messages) == [42, 43, 44]
            assert d1.methods() == ["Reserve", "Decode"]
            assert gate.stats.hung_instances == {"decode": 1}  # p0 answered its probe: not blamed
            assert gate.stats.num_prefill_retries == 0
            # p0 may still be sending the first attempt's KV when the second reaches it: the
            # second has an id of its own, so the two never collide there.
            assert [r.request_id for r in p0.requests_of("StreamPrefill")] == ["r1", "r1@1"]
            assert [r.request_id for r in d1.requests_of("Reserve")] == ["r1@1"]
    run(scenario)


def test_a_slow_but_live_decode_is_probed_and_waited_for(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, **HANG) as gate:
            p0 = FakeInstance("p0", "prefill")
            go_on = asyncio.Event()
            d0 = FakeInstance("d0", "decode", Behaviour(block_ids=[1, 2]))
            d1 = FakeInstance("d1", "decode")
            d0.Decode = _slow_decode(d0, go_on)  # before it starts: its server binds the methods
            await gate.add(p0, d0, d1)
            call = gate.stub.Generate(generate_request(max_tokens=3))
            stream = asyncio.ensure_future(collect(call))
            await _wait_for(lambda: d0.num_health_checks >= 3)  # probed on every stall, answered each time
            go_on.set()
            messages = await stream
            assert _tokens(messages) == [42, 43, 44]
            assert d1.methods() == [] and gate.stats.migrations == {} and gate.stats.hung_instances == {}
            assert gate.stats.num_stall_probes >= 3
    run(scenario)


def _slow_decode(fake: FakeInstance, go_on: asyncio.Event):
    """Decode that waits for `go_on` before its first message (a long engine step)."""
    original = type(fake).Decode

    async def decode(request, context):
        await go_on.wait()
        async for message in original(fake, request, context):
            yield message
    return decode


def test_a_hung_colocated_instance_is_skipped_before_it_streams(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, **HANG) as gate:
            c0 = FakeInstance("c0", "colocated")
            c1 = FakeInstance("c1", "colocated")
            c0.Generate = _never_answering(c0, "Generate")
            await gate.add(c0, c1)
            c0.hang()
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert _tokens(messages) == [42, 43, 44]
            assert c1.methods() == ["Generate"]
            await asyncio.wait_for(c0.cancelled.wait(), 5)
            assert gate.stats.hung_instances == {"colocated": 1}
    run(scenario)


def test_the_hang_timeouts_are_settings(monkeypatch):
    from services.gateway.settings import parse_settings

    monkeypatch.setenv("PDSERVE_STALL_TIMEOUT_S", "7.5")
    settings = parse_settings(["--control-call-timeout-s", "3", "--health-probe-timeout-s", "0.5"])
    assert (settings.stall_timeout_s, settings.control_call_timeout_s, settings.health_probe_timeout_s) == (7.5, 3, 0.5)


async def _wait_for(condition, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.02)

