"""The gateway when a decode instance is lost, against fake instances: before the first token
it reserves on the other decode instance and runs the prefill again toward it (the prefill
instances are not blamed); mid-stream it migrates: the continuation carries the prompt and
the tokens already streamed as resumed outputs, and the client sees one stream with the
right usage."""

from shared.pb.pdserve.v1 import generation_pb2 as gen
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import FIRST_TOKEN_ID, Behaviour, FakeInstance
from tests.unit.test_gateway_service import PROMPT_IDS, collect, gateway, generate_request, model, run  # noqa: F401


def test_a_decode_lost_before_the_first_token_is_replaced_and_prefill_not_blamed(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill", Behaviour(prefill_fails_toward="ucx-d0"))
            p1 = FakeInstance("p1", "prefill", Behaviour(prefill_fails_toward="ucx-d0"))
            d0 = FakeInstance("d0", "decode", Behaviour(block_ids=[1, 2, 3, 4]))
            d1 = FakeInstance("d1", "decode", Behaviour(block_ids=[5, 6, 7, 8]))
            await gate.add(p0, p1, d0, d1)
            await d0.set_serving(False)  # d0 ranks first (instance id) and is going away
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert [t for m in messages for t in m.token_ids] == [42, 43, 44]
            assert d0.methods() == ["Reserve", "Release"] and d1.methods() == ["Reserve", "Decode"]
            assert [list(p.dst_block_ids) for p in p0.requests_of("StreamPrefill")] == [[1, 2, 3, 4], [5, 6, 7, 8]]
            assert p1.methods() == []  # the prefill instance was not blamed for d0's loss
            assert gate.stats.num_prefill_retries == 0 and gate.stats.migrations == {}
    run(scenario)


def test_a_decode_draining_mid_stream_migrates_with_the_streamed_tokens(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode", Behaviour(decode_drains_after_first=True))
            d1 = FakeInstance("d1", "decode")
            await gate.add(p0, d0, d1)
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=8)))
            # d0 streamed "Hello" ([42]) then drained; d1 continued (the fake restarts its text).
            assert [t for m in messages for t in m.token_ids] == [42, 42, 43, 44]
            [reserve] = d1.requests_of("Reserve")
            assert list(reserve.prompt_token_ids) == PROMPT_IDS + [42]
            assert reserve.num_resumed_output_tokens == 1
            resumed_prefill = p0.requests_of("StreamPrefill")[1]
            assert list(resumed_prefill.prompt_token_ids) == PROMPT_IDS + [42]
            assert resumed_prefill.num_resumed_output_tokens == 1
            assert not resumed_prefill.sampling.HasField("prompt_logprobs")
            assert d1.requests_of("Decode")[0].first_token_id == FIRST_TOKEN_ID
            assert messages[-1].finish_reason == gen.FINISH_REASON_STOP
            assert messages[-1].usage.completion_tokens == 3 + 1  # d1's count plus the resumed token
            assert gate.stats.migrations == {"drain": 1}
    run(scenario)
