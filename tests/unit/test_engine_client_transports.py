"""One engine client (shared.engine.frontend), two core transports, one specification: every
test here runs against the core on a thread of this process (AsyncEngine) and in a child
process (CoreProcessClient), on the tiny random-weight Llama with the SmolLM2 tokenizer and the
in-memory KV connector (both directions, so one engine can send KV into its own reservation).

Streaming, detokenized text and n > 1 groups equal the offline engine's; a stop string ends
the request in the core; abort and an early close free the request; bad input names its
field; the observer's hooks come in one order, on the event loop (a refused request never
reaches them); a reservation's KV-arrival wait returns after the KV arrived and raises after a
failed transfer or when its lease ran out in the engine (renewed, it holds; run out, it is
freed and reported to `on_reservation_event` as EXPIRED, its prompt forgotten); a failure of the engine as a whole reaches `on_failure`, every stream, call
and KV wait as one EngineDeadError. Every test ends with every block free. One engine per
transport serves the module (a core process takes seconds to load), on an event loop of its
own thread.
"""

import asyncio
import contextlib
import dataclasses
import os
import signal
import threading

import pytest

from shared.engine import LLM, SamplingParams
from shared.engine.async_engine import AsyncEngine
from shared.engine_api.client import (CapacityError, EngineDeadError, GenerateRequest, KVSendParams,
                                      KVTransferFailedError, ReservationEvent, ReservationEventKind)
from shared.engine.core_process.client import CoreProcessClient
from shared.engine.frontend import EngineFrontend
from shared.engine_args import EngineArgs
from shared.errors import InvalidRequestError
from shared.guided.params import GuidedDecodingParams
from shared.kv_transfer.types import KVConnectorRole, KVTransferConfig
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.kv_split import IN_MEMORY
from tests.unit.test_engine import PROMPTS

TRANSPORTS = ["thread", "process"]
SETTINGS = dict(dtype="float32", block_size=4, num_blocks=64,
                kv_transfer=KVTransferConfig(IN_MEMORY, KVConnectorRole.BOTH))
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
GUIDED = SamplingParams(max_tokens=8, guided=GuidedDecodingParams(regex="[0-9]+"))
STOPPED = SamplingParams(max_tokens=8, stop=["x"])
KV_PROMPT = tuple(range(30, 67))  # 10 blocks of 4
OUT_OF_VOCABULARY = 10 ** 6
WAIT_S = 300  # a safety net for a hung test on a loaded machine, never a timing assertion


def make_client(transport: str, folder, tokenizer) -> EngineFrontend:
    if transport == "thread":
        engine = LLM(model=str(folder), **SETTINGS).engine
        engine.tokenizer = tokenizer
        return AsyncEngine(engine)
    return CoreProcessClient(EngineArgs.from_kwargs(model=str(folder), **SETTINGS).create_engine_config(),
                             tokenizer=tokenizer)


class LoopThread:
    """An event loop on a thread of its own, so that one client serves every test."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(WAIT_S)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@dataclasses.dataclass
class Served:
    client: EngineFrontend
    loop: LoopThread

    def run(self, scenario) -> None:
        """`scenario(client)` on the client's loop, then check that every block is free."""
        async def checked():
            result = await scenario(self.client)
            await assert_whole(self.client)
            return result
        return self.loop.run(checked())


@pytest.fixture(scope="module", params=TRANSPORTS)
def served(request, tiny_llama_folder, smollm2_tokenizer):  # noqa: F811 - fixture
    loop = LoopThread()
    client = make_client(request.param, tiny_llama_folder, smollm2_tokenizer)
    loop.run(client.start())
    try:
        yield Served(client, loop)
    finally:
        loop.run(client.stop())
        loop.close()


@pytest.fixture(scope="module")
def offline(tiny_llama_folder, smollm2_tokenizer):  # noqa: F811 - fixture
    """The offline engine (no transport, no frontend): the reference."""
    llm = LLM(model=str(tiny_llama_folder), **SETTINGS)
    llm.engine.tokenizer = llm.engine.output_processor.tokenizer = smollm2_tokenizer
    return llm


async def collect(stream) -> list:
    async with contextlib.aclosing(stream) as outputs:
        return [output async for output in outputs]


async def assert_whole(client: EngineFrontend) -> None:
    status = await client.status()
    assert client.load() == status.load == client.latest_status().load
    assert (status.load.num_free_blocks, status.load.num_waiting, status.load.num_running,
            status.load.num_reserved) == (client.info.num_blocks, 0, 0, 0)


def send_into(reservation, block_ids=None) -> KVSendParams:
    return KVSendParams(reservation.transfer_address, reservation.request_id,
                        block_ids if block_ids is not None else reservation.block_ids,
                        reservation.num_skip_blocks, reservation.transfer_token)


def prefill_request(request_id: str, send: KVSendParams) -> GenerateRequest:
    return GenerateRequest(request_id, KV_PROMPT, SamplingParams(temperature=0, max_tokens=1), kv_send=send)


# ---- streaming and text ------------------------------------------------------------------------

def test_streams_carry_the_offline_engines_tokens_and_text(served, offline):
    expected = offline.generate(PROMPTS, GREEDY)

    async def scenario(client):
        return await asyncio.gather(*(collect(client.generate(GenerateRequest(f"r{i}", tuple(prompt), GREEDY)))
                                      for i, prompt in enumerate(PROMPTS)))
    streams = served.run(scenario)
    for outputs, reference in zip(streams, expected):
        final = outputs[-1]
        assert final.finished and not any(output.finished for output in outputs[:-1])
        assert (final.token_ids, final.text) == (reference.token_ids, reference.text)
        assert [t for output in outputs for t in output.outputs[0].delta_token_ids] == final.token_ids
        assert "".join(output.outputs[0].delta_text for output in outputs) == final.text
        assert final.outputs[0].finish_reason == "length"


def test_a_stop_string_ends_the_request_in_the_core(served, offline):
    [full] = offline.generate([PROMPTS[2]], LONG)
    text = full.outputs[0].text
    stop = text[len(text) // 3: len(text) // 3 + 3]
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True, stop=[stop])
    [expected] = offline.generate([PROMPTS[2]], params)

    async def scenario(client):
        return (await collect(client.generate(GenerateRequest("stopped", tuple(PROMPTS[2]), params))))[-1]
    completion = served.run(scenario).outputs[0]
    assert (completion.text, completion.token_ids, completion.finish_reason, completion.stop_reason) == (
        expected.outputs[0].text, expected.outputs[0].token_ids, "stop", stop)
    assert len(completion.token_ids) < 100  # the core stopped it (assert_whole: nothing left running)


def test_n_completions_equal_the_offline_engines(served, offline):
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)
    [expected] = offline.generate([PROMPTS[0]], params)

    async def scenario(client):
        return (await collect(client.generate(GenerateRequest("group", tuple(PROMPTS[0]), params))))[-1]
    final = served.run(scenario)
    assert [(c.index, c.token_ids, c.text) for c in final.outputs] == [
        (c.index, c.token_ids, c.text) for c in expected.outputs]


# ---- abort -------------------------------------------------------------------------------------

def test_abort_and_an_early_close_free_the_request(served):
    async def scenario(client):
        stream = client.generate(GenerateRequest("aborted", tuple(PROMPTS[2]), LONG))
        assert not (await anext(stream)).finished
        await client.abort("aborted")
        rest = [output async for output in stream]  # outputs read before the abort may come first
        assert rest[-1].outputs[0].finish_reason == "abort" and not any(output.finished for output in rest[:-1])
        closed = client.generate(GenerateRequest("closed", tuple(PROMPTS[0]), LONG))
        await anext(closed)
        await closed.aclose()
        final = (await collect(client.generate(GenerateRequest("after", tuple(PROMPTS[1]), GREEDY))))[-1]
        assert len(final.token_ids) == 8
    served.run(scenario)


# ---- errors ------------------------------------------------------------------------------------

def test_bad_input_and_no_room_are_refused_naming_the_field(served):
    async def scenario(client):
        with pytest.raises(InvalidRequestError) as error:
            await collect(client.generate(GenerateRequest("bad", (5, OUT_OF_VOCABULARY), GREEDY)))
        assert error.value.field.startswith("prompt")
        with pytest.raises(InvalidRequestError, match="^guided"):  # the core's model folder has no tokenizer
            await collect(client.generate(GenerateRequest("guided", tuple(PROMPTS[1]), GUIDED)))
        tokenizer, client.tokenizer = client.tokenizer, None
        try:
            with pytest.raises(InvalidRequestError, match="^stop: stop strings need a tokenizer"):
                await collect(client.generate(GenerateRequest("stop", tuple(PROMPTS[1]), STOPPED)))
        finally:
            client.tokenizer = tokenizer
        running = client.generate(GenerateRequest("twice", tuple(PROMPTS[0]), LONG))
        await anext(running)
        with pytest.raises(InvalidRequestError, match="^request_id"):
            await collect(client.generate(GenerateRequest("twice", tuple(PROMPTS[1]), GREEDY)))
        await running.aclose()
        for call in (client.wait_kv("none"), collect(client.generate_reserved("none", 1, None)),
                     collect(client.prefill_reserved("none"))):
            with pytest.raises(InvalidRequestError, match="^request_id: 'none' has no reservation"):
                await call
        reserved = []
        with pytest.raises(CapacityError):
            for index in range(10):  # 10 blocks each, 64 in all
                prompt = tuple(token + index for token in KV_PROMPT)
                reserved.append(await client.reserve_kv(GenerateRequest(f"room{index}", prompt, GREEDY)))
        assert len(reserved) == 6
        with pytest.raises(InvalidRequestError, match="^request_id"):
            await client.reserve_kv(GenerateRequest("room0", KV_PROMPT, GREEDY))
        assert [await client.release_kv(r.request_id) for r in reserved] == [True] * 6
        assert not await client.release_kv("room0")
    served.run(scenario)


class KillableEngine:
    """A client of its own, and a way to make its engine fail as a whole."""

    def __init__(self, transport: str, client: EngineFrontend):
        self.transport, self.client = transport, client

    def kill(self) -> str:
        """End the engine; a word its EngineDeadError's message holds."""
        if self.transport == "process":
            os.kill(self.client.pid, signal.SIGKILL)
            return "killed by SIGKILL"

        def step():
            raise MemoryError("the step failed (injected)")
        self.client.transport.core.step = step  # white box: the engine thread's next step fails
        return "the engine thread failed: MemoryError: the step failed (injected)"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_engine_failure_reaches_everything_as_one_engine_dead_error(transport, tiny_llama_folder,
                                                                     smollm2_tokenizer):  # noqa: F811
    engine = KillableEngine(transport, make_client(transport, tiny_llama_folder, smollm2_tokenizer))
    client, failures = engine.client, []
    client.on_failure = failures.append

    async def scenario():
        streams = [client.generate(GenerateRequest(f"r{i}", tuple(prompt), LONG)) for i, prompt in enumerate(PROMPTS)]
        for stream in streams:
            await anext(stream)
        await client.reserve_kv(GenerateRequest("d", KV_PROMPT, GREEDY))
        waiting = asyncio.ensure_future(client.wait_kv("d"))
        how = engine.kill()
        errors = []
        for stream in streams:
            with pytest.raises(EngineDeadError) as error:
                async for _ in stream:
                    pass
            errors.append(error.value)
        for call in (waiting, client.status(), collect(client.generate(GenerateRequest("later", (1, 2), GREEDY)))):
            with pytest.raises(EngineDeadError) as error:
                await call
            errors.append(error.value)
        assert not client.is_alive
        assert len(failures) == 1 and isinstance(failures[0], EngineDeadError) and how in str(failures[0])
        assert {str(error) for error in errors} == {str(failures[0])}

    async def main():
        await client.start()
        try:
            await scenario()
        finally:
            await client.stop()
    asyncio.run(main())


# ---- hooks -------------------------------------------------------------------------------------

class Recorder:
    """An OutputObserver that writes down what it was told, and on which thread."""

    def __init__(self):
        self.events: list[tuple[str, str]] = []
        self.threads: set[int] = set()

    def on_start(self, request_id: str) -> None:
        self._note("start", request_id)

    def on_outputs(self, outputs) -> None:
        for output in outputs:
            self._note("final" if output.finished else "output", output.request_id)

    def on_stop(self, request_id: str) -> None:
        self._note("stop", request_id)

    def of(self, request_id: str) -> list[str]:
        return [event for event, of in self.events if of == request_id]

    def _note(self, event: str, request_id: str) -> None:
        self.events.append((event, request_id))
        self.threads.add(threading.get_ident())


def test_hooks_come_in_one_order_on_the_event_loop(served):
    recorder = Recorder()

    async def scenario(client):
        client.observer = recorder
        try:
            await collect(client.generate(GenerateRequest("done", tuple(PROMPTS[1]), GREEDY)))
            closed = client.generate(GenerateRequest("closed", tuple(PROMPTS[0]), LONG))
            await anext(closed)
            await closed.aclose()
            aborted = client.generate(GenerateRequest("aborted", tuple(PROMPTS[0]), LONG))
            await anext(aborted)
            await client.abort("aborted")
            await collect(aborted)
            with pytest.raises(InvalidRequestError):
                await collect(client.generate(GenerateRequest("refused", (5, OUT_OF_VOCABULARY), GREEDY)))
        finally:
            client.observer = None
    served.run(scenario)
    done, closed, aborted = recorder.of("done"), recorder.of("closed"), recorder.of("aborted")
    assert done == ["start"] + ["output"] * (len(done) - 3) + ["final", "stop"]
    assert closed == ["start"] + ["output"] * (len(closed) - 2) + ["stop"] and len(closed) > 2
    assert aborted == ["start"] + ["output"] * (len(aborted) - 3) + ["final", "stop"]
    assert recorder.of("refused") == []  # the engine never took it: not an abort to count
    assert recorder.threads == {served.loop.thread.ident}


# ---- KV arrival --------------------------------------------------------------------------------

def test_a_kv_arrival_wait_returns_after_the_kv_arrived_and_raises_after_a_failed_transfer(served, offline):
    [expected] = offline.generate([list(KV_PROMPT)], GREEDY)

    async def scenario(client):
        reservation = await client.reserve_kv(GenerateRequest("d", KV_PROMPT, GREEDY))
        waiting = asyncio.ensure_future(client.wait_kv("d"))
        wrong = send_into(reservation, tuple(reversed(reservation.block_ids)))
        with pytest.raises(KVTransferFailedError, match="dst_block_ids"):
            await collect(client.generate(prefill_request("p0", wrong)))
        with pytest.raises(KVTransferFailedError, match="dst_block_ids"):
            await waiting
        prefilled = (await collect(client.generate(prefill_request("p1", send_into(reservation)))))[-1]
        assert prefilled.kv_transfer.num_bytes > 0
        await client.wait_kv("d")
        await client.wait_kv("d")  # arrived: returns at once
        decoded = await collect(client.generate_reserved("d", prefilled.token_ids[0], None))
        assert (decoded[-1].token_ids, decoded[-1].text) == (expected.token_ids, expected.text)
        with pytest.raises(InvalidRequestError, match="^request_id"):
            await client.wait_kv("d")  # decoded: no reservation any more
    served.run(scenario)


def test_a_renewed_lease_holds_and_one_that_runs_out_frees_the_reservation_and_is_reported(served):
    async def scenario(client):
        events: list[ReservationEvent] = []
        client.on_reservation_event = events.append
        try:
            await client.reserve_kv(GenerateRequest("held", KV_PROMPT, GREEDY), lease_s=WAIT_S)
            lapsing = tuple(token + 1 for token in KV_PROMPT)
            await client.reserve_kv(GenerateRequest("lapsing", lapsing, GREEDY), lease_s=WAIT_S)
            assert await client.renew_kv("held", WAIT_S)
            waiting = asyncio.ensure_future(client.wait_kv("lapsing"))
            await client.status()  # a round trip: the wait asked the engine before the renewal below
            assert await client.renew_kv("lapsing", 0.001)  # its lease runs out in the engine now
            with pytest.raises(KVTransferFailedError, match="'lapsing' timed out"):
                await waiting
            assert [(event.request_id, event.kind) for event in events] == [("lapsing", ReservationEventKind.EXPIRED)]
            assert not await client.renew_kv("lapsing", WAIT_S)
            with pytest.raises(InvalidRequestError, match="^request_id: 'lapsing' has no reservation"):
                await client.wait_kv("lapsing")
            await client.reserve_kv(GenerateRequest("lapsing", lapsing, GREEDY))  # the client forgot it too
            assert await client.release_kv("lapsing") and await client.release_kv("held")
        finally:
            client.on_reservation_event = None
    served.run(scenario)
