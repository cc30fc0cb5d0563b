"""AsyncEngine's per-iteration hook (`on_loop(is_idle)`, where the heap trimmer runs): it sees the
engine busy while a request runs and idle afterwards, an idle engine keeps calling it without
any command arriving, and a hook that raises never stops the engine."""

import asyncio
import threading

from shared.engine import LLM, SamplingParams
from shared.engine.core_process import core_loop
from shared.engine.async_engine import AsyncEngine
from shared.engine_api.client import GenerateRequest


def make_async_engine(folder, on_loop) -> AsyncEngine:
    return AsyncEngine(LLM(model=str(folder), dtype="float32", num_blocks=8).engine, on_loop=on_loop)


async def generate_one(async_engine: AsyncEngine, request_id: str) -> int:
    request = GenerateRequest(request_id, (1, 2, 3), SamplingParams(max_tokens=3, ignore_eos=True))
    return sum([len(output.outputs[0].token_ids) > 0 async for output in async_engine.generate(request)])


def test_the_hook_sees_the_engine_busy_then_idle(tiny_llama_folder):
    seen = []
    async_engine = make_async_engine(tiny_llama_folder, seen.append)

    async def scenario():
        await async_engine.start()
        try:
            assert await generate_one(async_engine, "r") > 0
            await async_engine.status()  # runs after an idle iteration called the hook
        finally:
            await async_engine.stop()
    asyncio.run(scenario())
    assert False in seen  # an iteration that stepped the request
    assert True in seen[seen.index(False):]


def test_an_idle_engine_keeps_calling_the_hook_with_no_command(tiny_llama_folder, monkeypatch):
    monkeypatch.setattr(core_loop, "IDLE_POLL_MS", 10)
    idle_calls = []
    woke_again = threading.Event()

    def on_loop(is_idle: bool) -> None:
        idle_calls.append(is_idle)
        if idle_calls.count(True) >= 3:
            woke_again.set()
    async_engine = make_async_engine(tiny_llama_folder, on_loop)

    async def scenario():
        await async_engine.start()
        try:
            assert await asyncio.to_thread(woke_again.wait, 60)  # nothing was submitted: it woke by itself
        finally:
            await async_engine.stop()
    asyncio.run(scenario())


def test_a_hook_that_raises_does_not_stop_the_engine(tiny_llama_folder):
    def broken_hook(is_idle: bool) -> None:
        raise RuntimeError("hook failed (injected)")
    async_engine = make_async_engine(tiny_llama_folder, broken_hook)

    async def scenario():
        await async_engine.start()
        try:
            assert await generate_one(async_engine, "r") > 0
            assert async_engine.is_alive
        finally:
            await async_engine.stop()
    asyncio.run(scenario())
