"""The instance side of the early first token and of conditional disaggregation, in-process
(real grpc.aio servers, real Redis, real UCX over loopback, the tiny random-weight model):

- StreamPrefill sends the first token (with its logprobs and the prompt logprobs) while the KV
  send has not ended, then the outcome; Decode from that token gives the offline engine's
  tokens, its first message being that same token.
- PrefillLocally computes a reservation's prompt on the decode instance (the offline engine's
  tokens again), and is refused, the reservation kept, beyond --max-local-prefill-tokens.
"""

import asyncio

import grpc
import pytest

from shared.kv_transfer.types import FinishedTransfers
from shared.pb.pdserve.v1 import generation_pb2 as gen_pb
from shared.pb.pdserve.v1 import instance_pb2 as pb
from tests.unit.test_instance_services import (  # noqa: F401 - fixtures
    TIMEOUT_S, expect_status, fresh_ucx, greedy, make_settings, offline, offline_output, prefill_and_decode,
    prefill_request, prompt_ids, reserve, running)


def hold_finished_sends(instance):
    """White box (in-thread engine): the prefill engine's connector reports no finished send
    until `release()` is called, as a slow network's sends would not end."""
    connector = instance.runtime.engine.transport.core.connector  # noqa: SLF001
    real_get_finished, held, is_holding = connector.get_finished, [], [True]

    def get_finished():
        finished = real_get_finished()
        held.extend(finished.sending)
        if is_holding[0]:
            return FinishedTransfers((), finished.receiving)
        sending, held[:] = tuple(held), []
        return FinishedTransfers(sending, finished.receiving)

    async def release():
        is_holding[0] = False
        await instance.runtime.engine.status()  # a command: the engine thread polls again

    connector.get_finished = get_finished
    return held, release


def test_stream_prefill_sends_the_first_token_before_its_kv_send_ends(redis_server, tiny_llama_folder, offline):
    prompt = prompt_ids(37, 11)
    sampling = greedy(6, logprobs=2, prompt_logprobs=1)

    async def scenario():
        async with prefill_and_decode(tiny_llama_folder, redis_server.url) as (prefill, decode):
            held, release = hold_finished_sends(prefill)
            reserved = await reserve(decode, "r", prompt, sampling)
            call = prefill.stub.StreamPrefill(prefill_request(reserved, "r", prompt, sampling=sampling),
                                              timeout=TIMEOUT_S)
            first = await call.read()
            assert first.WhichOneof("event") == "first_token"  # while the send has not ended
            await release()
            done = (await call.read()).done
            assert await call.read() == grpc.aio.EOF
            assert held == [] and done.kv_bytes_sent > 0 and done.first_token_id == first.first_token.token_id
            assert not done.prompt_logprobs and not done.HasField("finish_reason")  # sent with the token
            expected = offline_output(offline, prompt, temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2,
                                      prompt_logprobs=1)
            token = first.first_token
            assert token.token_id == expected.token_ids[0]
            assert token.logprobs.logprob == pytest.approx(expected.outputs[0].logprobs[0].logprob, abs=1e-4)
            assert [e.token_id for e in token.prompt_logprobs] == prompt[1:]
            decoded = [m async for m in decode.stub.Decode(
                pb.DecodeRequest(request_id="r", first_token_id=token.token_id, first_logprobs=token.logprobs),
                timeout=TIMEOUT_S)]
            assert list(decoded[0].token_ids) == [token.token_id] and decoded[0].text == token.text
            assert [t for m in decoded for t in m.token_ids] == expected.token_ids
    asyncio.run(scenario())


def test_stream_prefill_says_when_the_completion_ends_with_the_first_token(redis_server, tiny_llama_folder,
                                                                          offline):
    prompt = prompt_ids(20, 12)

    async def scenario():
        async with prefill_and_decode(tiny_llama_folder, redis_server.url) as (prefill, decode):
            reserved = await reserve(decode, "one", prompt, greedy(1))
            events = [e async for e in prefill.stub.StreamPrefill(
                prefill_request(reserved, "one", prompt, sampling=greedy(1)), timeout=TIMEOUT_S)]
            assert [e.WhichOneof("event") for e in events] == ["first_token", "done"]
            assert events[1].done.finish_reason == gen_pb.FINISH_REASON_LENGTH  # max_tokens 1: no Decode needed
            assert (await decode.stub.Release(pb.ReleaseRequest(request_id="one"), timeout=TIMEOUT_S)).released
    asyncio.run(scenario())


def test_a_reservation_prefilled_on_the_decode_instance_gives_the_offline_tokens(redis_server, tiny_llama_folder,
                                                                                 offline):
    prompt = prompt_ids(37, 13)
    sampling = greedy(7, prompt_logprobs=1)

    async def scenario():
        async with running(make_settings("decode", tiny_llama_folder, redis_server.url)) as decode:
            reserved = await reserve(decode, "local", prompt, sampling)
            messages = [m async for m in decode.stub.PrefillLocally(pb.LocalPrefillRequest(request_id="local"),
                                                                    timeout=TIMEOUT_S)]
            expected = offline_output(offline, prompt, temperature=0.0, max_tokens=7, ignore_eos=True,
                                      prompt_logprobs=1)
            assert [t for m in messages for t in m.token_ids] == expected.token_ids
            assert [e.token_id for e in messages[0].prompt_logprobs] == prompt[1:]
            assert (messages[-1].usage.prompt_tokens, messages[-1].usage.completion_tokens) == (len(prompt), 7)
            status = await decode.status()
            assert status.num_prompt_tokens_computed == len(prompt) and len(reserved.block_ids) == 3
            assert (status.num_local_prefills, status.num_local_prefills_refused) == (1, 0)
            await expect_status(decode.stub.Decode(pb.DecodeRequest(request_id="local"), timeout=TIMEOUT_S).read(),
                                grpc.StatusCode.NOT_FOUND)  # taken: nothing left to decode
    asyncio.run(scenario())


def test_a_local_prefill_beyond_the_budget_is_refused_and_the_reservation_kept(redis_server, tiny_llama_folder,
                                                                               offline):
    prompt = prompt_ids(37, 14)

    async def scenario():
        async with prefill_and_decode(tiny_llama_folder, redis_server.url,
                                      decode_overrides={"max_local_prefill_tokens": 36}) as (prefill, decode):
            reserved = await reserve(decode, "big", prompt, greedy(4))
            call = decode.stub.PrefillLocally(pb.LocalPrefillRequest(request_id="big"), timeout=TIMEOUT_S)
            details = await expect_status(call.read(), grpc.StatusCode.RESOURCE_EXHAUSTED, "no room")
            assert "37 tokens" in details
            events = [e async for e in prefill.stub.StreamPrefill(
                prefill_request(reserved, "big", prompt, sampling=greedy(4)), timeout=TIMEOUT_S)]
            first = events[0].first_token
            decoded = [m async for m in decode.stub.Decode(
                pb.DecodeRequest(request_id="big", first_token_id=first.token_id), timeout=TIMEOUT_S)]
            expected = offline_output(offline, prompt, temperature=0.0, max_tokens=4, ignore_eos=True)
            assert [t for m in decoded for t in m.token_ids] == expected.token_ids
            status = await decode.status()
            assert (status.num_local_prefills, status.num_local_prefills_refused) == (0, 1)
    asyncio.run(scenario())
