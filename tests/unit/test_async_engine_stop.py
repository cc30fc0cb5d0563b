"""A call to the engine thread never waits forever: once the thread is stopped or has failed,
calls waiting for it (or made after) get EngineDeadError."""

import asyncio

import pytest

from shared.engine import LLM
from shared.engine.async_engine import AsyncEngine, EngineDeadError
from shared.engine_api.client import CachedSend


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


def test_calls_waiting_when_the_engine_thread_fails_get_its_error(tiny_llama_folder, monkeypatch):
    async_engine = AsyncEngine(LLM(model=str(tiny_llama_folder), dtype="float32", num_blocks=8).engine)
    def dies_while_a_call_waits(*args):
        raise MemoryError("engine thread died (injected)")
    monkeypatch.setattr(async_engine.transport.core, "send_cached", dies_while_a_call_waits)

    async def scenario():
        await async_engine.start()
        send = CachedSend("r", (1, 2), None, 0, "memory:none", (0,), b"")
        waiting = asyncio.ensure_future(async_engine.send_cached(send))  # the thread dies running it
        status = asyncio.ensure_future(async_engine.status())  # queued behind it
        for call in (waiting, status):
            with pytest.raises(EngineDeadError, match="the engine thread failed: MemoryError: .*injected"):
                await asyncio.wait_for(call, 30)
        assert not async_engine.is_alive
        with pytest.raises(EngineDeadError, match="injected"):
            await async_engine.status()
        await async_engine.stop()
    asyncio.run(scenario())
