"""The gateway's early first token, against fake instances: the prefill instance's first token
reaches the client before the prefill answers and before Decode starts, and never twice; a
prefill that dies after it is replaced, Decode starting from the token the client has; a
completion that ends with its first token needs no Decode; a decode instance lost after it
continues after it on another one."""

import asyncio

import grpc

from shared.pb.pdserve.v1 import generation_pb2 as gen
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import FIRST_TOKEN_ID, Behaviour, FakeInstance
from tests.unit.test_gateway_service import (  # noqa: F401 - model is a fixture
    PROMPT_IDS, collect, gateway, generate_request, model, run, wait_until)


async def read_to_the_end(call) -> list:
    messages = []
    while (message := await call.read()) is not grpc.aio.EOF:
        messages.append(message)
    return messages


def tokens_of(messages) -> list[int]:
    return [token for message in messages for token in message.token_ids]


def test_the_first_token_reaches_the_client_before_the_prefill_answers_and_decode_starts(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            outcome = asyncio.Event()  # the prefill's KV is "in flight" until this is set
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_holds_outcome=outcome))
            d0 = FakeInstance("d0", "decode")
            await gate.add(p0, d0)
            call = gate.stub.Generate(generate_request(max_tokens=3, logprobs=1))
            first = await call.read()
            assert (first.text, list(first.token_ids)) == ("Hello", [FIRST_TOKEN_ID])
            assert [entry.token_id for entry in first.logprobs] == [FIRST_TOKEN_ID]
            assert first.finish_reason == gen.FINISH_REASON_UNSPECIFIED
            assert d0.methods() == ["Reserve"]  # Decode has not started: the prefill has not answered
            outcome.set()
            rest = await read_to_the_end(call)
            assert tokens_of([first, *rest]) == [42, 43, 44]  # the first token once
            assert "".join(m.text for m in [first, *rest]) == "Hello world!"
            assert rest[-1].finish_reason == gen.FINISH_REASON_STOP and rest[-1].usage.completion_tokens == 3
            assert d0.methods() == ["Reserve", "Decode"]
            assert d0.requests_of("Decode")[0].first_token_id == FIRST_TOKEN_ID
    run(scenario)


def test_a_client_cancelling_after_the_first_token_cancels_the_prefill_and_frees_the_reservation(
        redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_holds_outcome=asyncio.Event()))  # never answers
            d0 = FakeInstance("d0", "decode")
            await gate.add(p0, d0)
            call = gate.stub.Generate(generate_request(max_tokens=3))
            assert list((await call.read()).token_ids) == [FIRST_TOKEN_ID]
            call.cancel()
            await asyncio.wait_for(p0.cancelled.wait(), 5)
            await wait_until(lambda: gate.stats.num_cancelled == 1)  # the relay's cleanup has run
            await gate.server.state.relay.drain_background()
            assert d0.methods() == ["Reserve", "Release"]
    run(scenario)


def test_a_prefill_that_dies_after_its_first_token_is_replaced_and_decode_starts_from_that_token(
        redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_fails_after_first_token=1))
            p1 = FakeInstance("p1", "prefill", Behaviour(first_token=(99, "Bye")))  # samples another token
            d0 = FakeInstance("d0", "decode")
            await gate.add(p0, p1, d0)
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert tokens_of(messages) == [42, 43, 44] and "Bye" not in "".join(m.text for m in messages)
            assert (p0.methods(), p1.methods()) == (["StreamPrefill"], ["StreamPrefill"])
            assert d0.methods() == ["Reserve", "Decode"]  # the reservation was kept for the retry
            assert d0.requests_of("Decode")[0].first_token_id == FIRST_TOKEN_ID  # the client's, not p1's
            assert gate.stats.num_prefill_retries == 1 and gate.stats.migrations == {}
    run(scenario)


def test_a_completion_that_ends_with_its_first_token_needs_no_decode(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_first_token_ends=True))
            d0 = FakeInstance("d0", "decode")
            await gate.add(p0, d0)
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=5)))
            assert [(m.text, list(m.token_ids)) for m in messages] == [("Hello", [42]), ("?", [])]
            assert messages[-1].finish_reason == gen.FINISH_REASON_STOP
            assert (messages[-1].usage.prompt_tokens, messages[-1].usage.completion_tokens) == (len(PROMPT_IDS), 1)
            await gate.server.state.relay.drain_background()
            assert d0.methods() == ["Reserve", "Release"]
    run(scenario)


def test_a_decode_instance_lost_while_the_prefill_fails_after_its_first_token_continues_after_it(
        redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_fails_after_first_token=1))
            d0 = FakeInstance("d0", "decode", Behaviour(block_ids=[1, 2, 3, 4]))
            d1 = FakeInstance("d1", "decode", Behaviour(block_ids=[5, 6, 7, 8]))
            await gate.add(p0, d0, d1)
            await d0.set_serving(False)  # d0 (first by id) drains while the prefill toward it fails
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=8)))
            # The client keeps its first token; the continuation on d1 resumes after it (the fakes
            # restart their text: the next token they "sample" is 42 again).
            assert tokens_of(messages) == [42, 42, 43, 44]
            await gate.server.state.relay.drain_background()
            assert d0.methods() == ["Reserve", "Release"]
            [reserve] = d1.requests_of("Reserve")
            assert list(reserve.prompt_token_ids) == PROMPT_IDS + [42] and reserve.num_resumed_output_tokens == 1
            assert messages[-1].usage.completion_tokens == 3 + 1
            assert gate.stats.migrations == {"drain": 1}
    run(scenario)


def test_a_decode_instance_that_lost_the_reservation_after_the_first_token_is_replaced(redis_server, model):  # noqa: F811
    # Its engine core restarted between the KV's arrival and Decode: the reservation is gone.
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode", Behaviour(decode_error=grpc.StatusCode.NOT_FOUND))
            d1 = FakeInstance("d1", "decode")
            await gate.add(p0, d0, d1)
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=8)))
            assert tokens_of(messages) == [42, 42, 43, 44]  # continued on d1 after the client's token
            assert d0.methods() == ["Reserve", "Decode"] and d1.requests_of("Reserve")[0].num_resumed_output_tokens == 1
            assert gate.stats.migrations == {"failure": 1}
    run(scenario)
