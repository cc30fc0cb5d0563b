"""What only the engine-core process client does, against a real child core on the tiny
random-weight Llama: a core killed mid-stream (every stream fails with EngineDeadError naming
the signal, a restarted core serves again) and a core that fails while loading. What both
transports do is specified once, in test_engine_client_transports.py."""

import asyncio
import os
import signal

import pytest

from shared.engine_api.client import EngineDeadError, GenerateRequest
from shared.engine.core_process.client import CoreProcessClient
from shared.engine_args import EngineArgs
from shared.sampling.params import SamplingParams
from tests.unit.test_engine import PROMPTS

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
SETTINGS = dict(dtype="float32", block_size=4, num_blocks=64)


def core_client(folder) -> CoreProcessClient:
    return CoreProcessClient(EngineArgs.from_kwargs(model=str(folder), **SETTINGS).create_engine_config())


async def collect(client, request_id, prompt, params):
    outputs = [output async for output in client.generate(GenerateRequest(request_id, tuple(prompt), params))]
    return outputs[-1], outputs


async def assert_core_pool_is_whole(client):
    status = await client.status()
    assert client.latest_status().load.num_total_blocks == 64
    assert status.load.num_free_blocks == status.load.num_total_blocks == 64
    assert (status.load.num_waiting, status.load.num_running) == (0, 0)


def run_with_core(folder, scenario):
    async def main():
        client = core_client(folder)
        await client.start()
        try:
            await scenario(client)
            await assert_core_pool_is_whole(client)
        finally:
            await client.stop()
    asyncio.run(main())


# (SIGKILL without the restart: test_engine_client_transports.py)
@pytest.mark.parametrize("signum", [signal.SIGSEGV], ids=["SIGSEGV"])
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
