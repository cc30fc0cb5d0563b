"""A call to the engine thread never waits forever: once the thread is stopped or has failed,
calls queued for it (or made after) get EngineDeadError."""

import asyncio

import pytest

from shared.engine import LLM
from shared.engine.async_engine import AsyncEngine, EngineDeadError


def test_a_call_after_stop_fails_instead_of_waiting_forever(tiny_llama_folder):
    async_engine = AsyncEngine(LLM(model=str(tiny_llama_folder), dtype="float32", num_blocks=8).engine)

    async def scenario():
        await async_engine.start()
        assert async_engine.is_alive
        assert (await async_engine.status()).load.num_total_blocks == 8
        await async_engine.stop()
        assert not async_engine.is_alive
        with pytest.raises(EngineDeadError, match="stopped"):
            await asyncio.wait_for(async_engine.status(), 30)
    asyncio.run(scenario())


def test_calls_queued_when_the_engine_thread_fails_get_its_error(tiny_llama_folder, monkeypatch):
    async_engine = AsyncEngine(LLM(model=str(tiny_llama_folder), dtype="float32", num_blocks=8).engine)

    def dies_before_serving(block):
        raise MemoryError("engine thread died (injected)")
    monkeypatch.setattr(async_engine, "_run_commands", dies_before_serving)

    async def scenario():
        queued = asyncio.ensure_future(async_engine.status())  # queued before the thread runs
        await asyncio.sleep(0)
        await async_engine.start()
        with pytest.raises(EngineDeadError, match="injected"):
            await asyncio.wait_for(queued, 30)
        assert not async_engine.is_alive
        await async_engine.stop()
    asyncio.run(scenario())
