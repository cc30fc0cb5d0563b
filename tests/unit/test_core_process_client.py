"""The engine-core process client against a real child core on the tiny random-weight Llama:
its outputs equal the in-thread engine's, abort and stop strings end requests in the core,
n > 1 groups, bad input, and a core killed mid-stream (every stream fails with
EngineDeadError, a restarted core serves again). Every test ends with every block free."""

import asyncio
import os
import signal

import pytest

from shared.engine.core_process.client import CoreProcessClient
from shared.engine_api.client import EngineDeadError, GenerateRequest
from shared.engine_args import EngineArgs
from shared.errors import InvalidRequestError
from shared.guided.params import GuidedDecodingParams
from shared.sampling.params import SamplingParams
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.test_engine import PROMPTS, assert_pool_is_whole, make_llm

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
SETTINGS = dict(dtype="float32", block_size=4, num_blocks=64)


def core_client(folder, tokenizer=None) -> CoreProcessClient:
    return CoreProcessClient(EngineArgs.from_kwargs(model=str(folder), **SETTINGS).create_engine_config(), tokenizer=tokenizer)


async def collect(client, request_id, prompt, params):
    outputs = [output async for output in client.generate(GenerateRequest(request_id, tuple(prompt), params))]
    return outputs[-1], outputs


async def assert_core_pool_is_whole(client):
    status = await client.status()
    assert client.latest_status().load.num_total_blocks == 64
    assert status.load.num_free_blocks == status.load.num_total_blocks == 64
    assert (status.load.num_waiting, status.load.num_running) == (0, 0)


def run_with_core(folder, scenario, tokenizer=None):
    async def main():
        client = core_client(folder, tokenizer)
        await client.start()
        try:
            await scenario(client)
            await assert_core_pool_is_whole(client)
        finally:
            await client.stop()
    asyncio.run(main())


def in_thread_outputs(folder, prompts, params, tokenizer=None):
    llm = make_llm(folder)
    if tokenizer is not None:
        llm.engine.tokenizer = llm.engine.output_processor.tokenizer = tokenizer
    outputs = llm.generate(prompts, params)
    assert_pool_is_whole(llm)
    return outputs


def test_concurrent_greedy_outputs_equal_the_in_thread_engine(tiny_llama_folder):
    expected = [output.token_ids for output in in_thread_outputs(tiny_llama_folder, PROMPTS, GREEDY)]

    async def scenario(client):
        results = await asyncio.gather(*(collect(client, f"r{i}", prompt, GREEDY) for i, prompt in enumerate(PROMPTS)))
        assert [final.token_ids for final, _ in results] == expected
        for final, outputs in results:
            assert [t for output in outputs for t in output.outputs[0].delta_token_ids] == final.token_ids
            assert final.outputs[0].finish_reason == "length"
    run_with_core(tiny_llama_folder, scenario)


def test_n_completions_equal_the_in_thread_engine(tiny_llama_folder):
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)
    [expected] = in_thread_outputs(tiny_llama_folder, [PROMPTS[0]], params)

    async def scenario(client):
        final, _ = await collect(client, "group", PROMPTS[0], params)
        assert [c.token_ids for c in final.outputs] == [c.token_ids for c in expected.outputs]
        assert [c.index for c in final.outputs] == [0, 1, 2]
    run_with_core(tiny_llama_folder, scenario)


def test_a_stop_string_ends_the_request_in_the_core(tiny_llama_folder, smollm2_tokenizer):
    [full] = in_thread_outputs(tiny_llama_folder, [PROMPTS[2]], LONG, smollm2_tokenizer)
    text = full.outputs[0].text
    stop = text[len(text) // 3: len(text) // 3 + 3]
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True, stop=[stop])
    [expected] = in_thread_outputs(tiny_llama_folder, [PROMPTS[2]], params, smollm2_tokenizer)

    async def scenario(client):
        final, _ = await collect(client, "stopped", PROMPTS[2], params)
        completion = final.outputs[0]
        assert (completion.text, completion.finish_reason, completion.stop_reason) == (
            expected.outputs[0].text, "stop", stop)
        assert completion.token_ids == expected.outputs[0].token_ids
        assert len(completion.token_ids) < 100
        assert (await client.status()).num_requests_finished == 1
    run_with_core(tiny_llama_folder, scenario, smollm2_tokenizer)


def test_abort_and_an_early_close_free_the_request(tiny_llama_folder):
    async def scenario(client):
        stream = client.generate(GenerateRequest("aborted", tuple(PROMPTS[2]), LONG))
        first = await anext(stream)
        assert not first.finished
        await client.abort("aborted")
        rest = [output async for output in stream]
        assert rest[-1].outputs[0].finish_reason == "abort"
        closed = client.generate(GenerateRequest("closed", tuple(PROMPTS[0]), LONG))
        await anext(closed)
        await closed.aclose()
        # The core kept stepping meanwhile; a later request runs normally.
        final, _ = await collect(client, "after", PROMPTS[1], GREEDY)
        assert len(final.token_ids) == 8
    run_with_core(tiny_llama_folder, scenario)


def test_bad_input_is_refused_naming_the_field(tiny_llama_folder):
    async def scenario(client):
        with pytest.raises(InvalidRequestError) as error:
            await collect(client, "bad", [5, 999], GREEDY)
        assert error.value.field.startswith("prompt")
        with pytest.raises(InvalidRequestError) as error:  # compiled in the core, which has no tokenizer
            await collect(client, "guided", PROMPTS[1], SamplingParams(guided=GuidedDecodingParams(regex="[0-9]+")))
        assert error.value.field == "guided"
        with pytest.raises(InvalidRequestError, match="stop strings need a tokenizer"):
            await collect(client, "no-tokenizer", PROMPTS[1], SamplingParams(stop=["x"]))
        final, _ = await collect(client, "good", PROMPTS[1], GREEDY)
        assert len(final.token_ids) == 8
    run_with_core(tiny_llama_folder, scenario)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSEGV], ids=["SIGKILL", "SIGSEGV"])
def test_a_killed_core_fails_every_stream_and_restarts(tiny_llama_folder, signum):
    deaths = []

    async def scenario(client):
        client.on_failure = deaths.append
        streams = [client.generate(GenerateRequest(f"r{i}", tuple(prompt), LONG)) for i, prompt in enumerate(PROMPTS)]
        for stream in streams:
            await anext(stream)
        os.kill(client.pid, signum)
        for stream in streams:
            with pytest.raises(EngineDeadError, match=f"was killed by {signal.Signals(signum).name}"):
                async for _ in stream:
                    pass
        assert not client.is_alive and len(deaths) == 1 and signal.Signals(signum).name in str(deaths[0])
        with pytest.raises(EngineDeadError):
            await collect(client, "refused", PROMPTS[1], GREEDY)
        await client.restart()
        assert client.is_alive and client.num_starts == 2
        final, _ = await collect(client, "after", PROMPTS[1], GREEDY)
        assert len(final.token_ids) == 8
    run_with_core(tiny_llama_folder, scenario)


def test_a_core_that_fails_while_loading_says_why(tmp_path):
    async def main():
        client = CoreProcessClient(EngineArgs.from_kwargs(model=str(tmp_path / "missing"), **SETTINGS).create_engine_config())
        with pytest.raises(EngineDeadError, match="failed while starting: .*missing"):
            await client.start()
        assert not client.is_alive
    asyncio.run(main())
