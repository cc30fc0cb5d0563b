"""AsyncEngine's per-iteration hook (`on_loop(is_idle)`, where the heap trimmer runs): it sees the
engine busy while a request runs and idle afterwards, an idle engine keeps calling it without
any command arriving, and a hook that raises never stops the engine."""

import asyncio
import threading

from shared.engine import LLM, SamplingParams
from shared.engine import async_engine as async_engine_module
from shared.engine.async_engine import AsyncEngine


def make_async_engine(folder) -> AsyncEngine:
    return AsyncEngine(LLM(model=str(folder), dtype="float32", num_blocks=8).engine)


async def generate_one(async_engine: AsyncEngine, request_id: str) -> int:
    engine = async_engine.engine
    add = lambda: engine.add_request([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True), request_id)  # noqa: E731
    return sum([len(output.outputs[0].token_ids) > 0 async for output in async_engine.generate(request_id, add)])


def test_the_hook_sees_the_engine_busy_then_idle(tiny_llama_folder):
    async_engine, seen = make_async_engine(tiny_llama_folder), []
    async_engine.on_loop = seen.append
    async_engine.start()

    async def scenario():
        assert await generate_one(async_engine, "r") > 0
        await async_engine.call(lambda: None)  # runs after an idle iteration called the hook
    try:
        asyncio.run(scenario())
    finally:
        async_engine.stop()
    assert False in seen  # an iteration that stepped the request
    assert seen[-1] is True


def test_an_idle_engine_keeps_calling_the_hook_with_no_command(tiny_llama_folder, monkeypatch):
    monkeypatch.setattr(async_engine_module, "IDLE_WAKE_S", 0.01)
    async_engine, idle_calls = make_async_engine(tiny_llama_folder), []
    woke_again = threading.Event()

    def on_loop(is_idle: bool) -> None:
        idle_calls.append(is_idle)
        if idle_calls.count(True) >= 3:
            woke_again.set()
    async_engine.on_loop = on_loop
    async_engine.start()
    try:
        assert woke_again.wait(timeout=60)  # nothing was submitted: the loop woke by itself
    finally:
        async_engine.stop()


def test_a_hook_that_raises_does_not_stop_the_engine(tiny_llama_folder):
    async_engine = make_async_engine(tiny_llama_folder)

    def broken_hook(is_idle: bool) -> None:
        raise RuntimeError("hook failed (injected)")
    async_engine.on_loop = broken_hook
    async_engine.start()
    try:
        assert asyncio.run(generate_one(async_engine, "r")) > 0
        assert async_engine.error is None
    finally:
        async_engine.stop()
