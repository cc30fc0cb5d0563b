"""Guided decoding cannot hurt other requests: size limits, compilation off the step loop,
constraints that allow nothing, and failures inside a guided row.

Tiny random Llama with the hand-made 256-token vocabulary; every test ends with the pool whole.
"""

import asyncio
import json
import re
import threading

import pytest

import shared.engine.guided_decoding as guided_decoding
from shared.engine import SamplingParams
from shared.engine.async_engine import AsyncEngine, RequestFailedError
from shared.engine_api.client import GenerateRequest
from shared.errors import InvalidRequestError
from shared.guided import GuidedDecodingParams as Guided
from shared.guided.limits import nesting_depth
from tests.unit.guided_vocab import VOCAB_SIZE, decode
from tests.unit.test_guided_engine import assert_pool_is_whole, make_llm

PROMPTS = [[5, 17, 92, 3, 44, 101, 7, 8], [11, 12, 13], [250, 1, 250, 1, 42, 9]]
DIGITS = Guided(regex="[0-9]{4}")


def wide_schema(num_properties: int) -> str:
    return json.dumps({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(num_properties)}})


def deep_schema(depth: int) -> str:
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "object"}' + "}}" * depth


# ---- limits and unsatisfiable constraints, at admission --------------------------------

@pytest.mark.parametrize("guided, field, message", [
    (Guided(json_schema=wide_schema(5000)), "guided.json_schema", "bytes; the limit is"),
    (Guided(json_schema=deep_schema(800)), "guided.json_schema", "levels deep; the limit is"),
    (Guided(regex="(" * 500 + "a" + ")" * 500), "guided.regex", "levels deep"),
    (Guided(grammar="root ::= root"), "guided.grammar", "matches no output at all"),
    (Guided(regex="[^\\s\\S]"), "guided.regex", "matches no output at all"),
])
def test_oversized_and_unsatisfiable_constraints_are_refused_naming_the_field(tiny_llama_folder, guided, field,
                                                                             message):
    llm = make_llm(tiny_llama_folder)
    with pytest.raises(InvalidRequestError) as caught:
        llm.engine.add_request(PROMPTS[0], SamplingParams(guided=guided))
    assert caught.value.field == field and message in caught.value.message
    assert len(caught.value.message) < 600
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(InvalidRequestError, match=f"^{field}: "):
        llm.engine.reserve_request(PROMPTS[0], SamplingParams(guided=guided), "r")
    assert_pool_is_whole(llm)


def test_a_dict_schema_too_deep_to_serialise_is_refused():
    schema = {"type": "object"}
    for _ in range(5000):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(InvalidRequestError, match="^guided.json_schema: nests too deeply"):
        Guided(json_schema=schema)


def test_nesting_depth_ignores_escaped_and_quoted_brackets():
    assert nesting_depth('{"a": "(((("}', skip_quoted=True) == 1
    assert nesting_depth(r"\(\(a\)\)(b)", skip_quoted=False) == 1
    assert nesting_depth("[[[]]]", skip_quoted=False) == 3


def test_the_limits_are_engine_settings(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder, max_bytes=8)
    with pytest.raises(InvalidRequestError, match="^guided.regex: is 9 bytes; the limit is 8"):
        llm.engine.add_request(PROMPTS[0], SamplingParams(guided=Guided(regex="[0-9]{10}")))


# ---- run time: a guided row that fails or allows nothing finishes alone -------------------

def test_a_row_left_with_no_allowed_token_finishes_alone_with_an_error(tiny_llama_folder, monkeypatch):
    llm = make_llm(tiny_llama_folder)
    params = SamplingParams(temperature=0, max_tokens=8, guided=DIGITS)
    ids = [llm.engine.add_request(PROMPTS[0], params, request_id="dead"),
           llm.engine.add_request(PROMPTS[1], params, request_id="alive")]
    dead_matcher = llm.engine.requests_of("dead")[0].guided_matcher
    real_fill = guided_decoding.fill_bitmask

    def fill_with_a_dead_row(matchers, vocab_size):
        bitmask, restricts = real_fill(matchers, vocab_size)
        for row, matcher in enumerate(matchers):
            if matcher is dead_matcher:
                bitmask[row] = 0
        return bitmask, restricts
    monkeypatch.setattr(guided_decoding, "fill_bitmask", fill_with_a_dead_row)
    dead, alive = llm._run(ids)
    assert dead.outputs[0].finish_reason == "error" and "allows no token" in dead.outputs[0].error
    assert dead.token_ids == []
    assert alive.outputs[0].finish_reason == "stop" and re.fullmatch("[0-9]{4}", decode(alive.token_ids))
    assert all(token < VOCAB_SIZE for token in alive.token_ids)
    assert_pool_is_whole(llm)


def test_a_matcher_that_raises_fails_only_its_request(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    params = SamplingParams(temperature=0, max_tokens=8, guided=DIGITS)
    ids = [llm.engine.add_request(PROMPTS[0], params, request_id="broken"),
           llm.engine.add_request(PROMPTS[1], params, request_id="fine")]
    broken = llm.engine.requests_of("broken")[0]

    class Exploding:
        def __getattr__(self, name):
            raise RuntimeError("matcher state corrupted (injected)")
    broken.guided_matcher = Exploding()
    outputs = llm._run(ids)
    assert outputs[0].outputs[0].finish_reason == "error" and "injected" in outputs[0].outputs[0].error
    assert outputs[1].outputs[0].finish_reason == "stop" and re.fullmatch("[0-9]{4}", decode(outputs[1].token_ids))
    assert_pool_is_whole(llm)


# ---- compilation off the step loop -----------------------------------------------------

class BlockedCompiles:
    """Makes the grammar cache's compilations wait on an Event (a 'huge schema')."""

    def __init__(self, cache, monkeypatch):
        self.release = threading.Event()
        self.started = threading.Event()
        real = cache._compile_uncached

        def blocked(guided):
            self.started.set()
            self.release.wait(timeout=60)
            return real(guided)
        monkeypatch.setattr(cache, "_compile_uncached", blocked)


async def running(async_engine: AsyncEngine, scenario, release: threading.Event | None = None):
    """`scenario()` with the engine started; compilations held back are released in the end."""
    await async_engine.start()
    try:
        return await scenario()
    finally:
        if release is not None:
            release.set()
        await async_engine.stop()


async def collect(async_engine: AsyncEngine, request_id: str, prompt, params: SamplingParams):
    output = None
    async for output in async_engine.generate(GenerateRequest(request_id, tuple(prompt), params)):
        pass
    return output


def test_a_slow_compilation_never_stalls_other_requests(tiny_llama_folder, monkeypatch):
    llm = make_llm(tiny_llama_folder)
    blocked = BlockedCompiles(llm.engine.core.guided.grammars, monkeypatch)
    async_engine = AsyncEngine(llm.engine)

    async def scenario():
        guided_task = asyncio.create_task(collect(async_engine, "guided", PROMPTS[0],
                                                  SamplingParams(temperature=0, max_tokens=8, guided=DIGITS)))
        await asyncio.to_thread(blocked.started.wait, 60)
        plain = await collect(async_engine, "plain", PROMPTS[1], SamplingParams(temperature=0, max_tokens=6))
        assert plain.outputs[0].finish_reason == "length" and len(plain.token_ids) == 6
        assert not guided_task.done() and not llm.engine.requests_of("guided")  # still preparing, not scheduled
        blocked.release.set()
        return await guided_task

    guided = asyncio.run(running(async_engine, scenario, blocked.release))
    assert re.fullmatch("[0-9]{4}", decode(guided.token_ids))
    assert_pool_is_whole(llm)


def test_a_compilation_over_the_time_limit_is_refused(tiny_llama_folder, monkeypatch):
    llm = make_llm(tiny_llama_folder, compile_timeout_s=0.05)
    blocked = BlockedCompiles(llm.engine.core.guided.grammars, monkeypatch)
    async_engine = AsyncEngine(llm.engine)
    params = SamplingParams(max_tokens=8, guided=DIGITS)

    async def scenario():
        with pytest.raises(InvalidRequestError, match="^guided.regex: took longer than 0.05 s to compile"):
            await collect(async_engine, "slow", PROMPTS[0], params)

    asyncio.run(running(async_engine, scenario, blocked.release))
    assert not llm.engine.has_unfinished_requests()
    assert_pool_is_whole(llm)


def test_a_request_failure_reaches_its_stream_and_the_engine_serves_on(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    async_engine = AsyncEngine(llm.engine)
    params = SamplingParams(temperature=0, max_tokens=8, guided=DIGITS)

    add_request = llm.engine.core.add_request

    def add_failing_after_one_token(request_id, *args):
        # Breaks on the engine thread before any step: fails on its second token whatever the
        # timing (breaking it later, from the test, raced the request to its natural end).
        added = add_request(request_id, *args)
        for request in added if request_id == "bad" else ():
            request.guided_matcher = FailsAfterAccepting(request.guided_matcher, num_accepted=1)
        return added
    llm.engine.core.add_request = add_failing_after_one_token  # white box: fault injection

    async def scenario():
        stream = async_engine.generate(GenerateRequest("bad", tuple(PROMPTS[0]), params))
        first = await anext(stream)
        assert len(first.token_ids) == 1 and first.outputs[0].finish_reason is None
        with pytest.raises(RequestFailedError, match="injected"):
            async for _ in stream:
                pass
        return first, await collect(async_engine, "good", PROMPTS[1], params)

    _, good = asyncio.run(running(async_engine, scenario))
    assert good.outputs[0].finish_reason == "stop" and re.fullmatch("[0-9]{4}", decode(good.token_ids))
    assert async_engine.error is None  # the engine thread itself never failed
    assert_pool_is_whole(llm)


class FailsAfterAccepting:
    """A guided matcher that works for `num_accepted` tokens, then raises on the next one."""

    def __init__(self, matcher, num_accepted: int):
        self._matcher = matcher
        self._accepts_left = num_accepted

    def accept_token(self, token_id: int):
        if self._accepts_left == 0:
            raise RuntimeError("matcher state corrupted (injected)")
        self._accepts_left -= 1
        return self._matcher.accept_token(token_id)

    def __getattr__(self, name):
        return getattr(self._matcher, name)


def test_requests_for_a_constraint_being_compiled_share_one_compilation(tiny_llama_folder, monkeypatch):
    llm = make_llm(tiny_llama_folder)
    grammars = llm.engine.core.guided.grammars
    blocked = BlockedCompiles(grammars, monkeypatch)
    async_engine = AsyncEngine(llm.engine)
    params = SamplingParams(temperature=0, max_tokens=8, guided=DIGITS)

    async def scenario():
        tasks = [asyncio.create_task(collect(async_engine, f"r{i}", PROMPTS[i], params)) for i in range(3)]
        await asyncio.to_thread(blocked.started.wait, 60)
        await asyncio.sleep(0)
        blocked.release.set()
        return await asyncio.gather(*tasks)

    outputs = asyncio.run(running(async_engine, scenario, blocked.release))
    assert all(re.fullmatch("[0-9]{4}", decode(output.token_ids)) for output in outputs)
    assert grammars.num_misses == 1
    assert_pool_is_whole(llm)
