"""The engine API (shared.engine_api.client) through its in-thread implementation, AsyncEngine,
used as services use it: typed requests in, typed outputs out, no engine internals. KV moves
between two engines of this process through the in-memory KV connector."""

import asyncio
import contextlib

import pytest

from shared.engine import SamplingParams
from shared.engine.async_engine import AsyncEngine
from shared.engine_api.client import (
    CapacityError, GenerateRequest, KVSendParams, KVTransferFailedError,
)
from shared.errors import InvalidRequestError
from shared.kv_transfer.types import KVConnectorRole
from tests.unit.kv_split import connected_llm

PROMPT = tuple(range(30, 67))  # 3 blocks of 16
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


async def collect(stream) -> list:
    async with contextlib.aclosing(stream) as outputs:
        return [output async for output in outputs]


def send_to(reservation) -> KVSendParams:
    return KVSendParams(reservation.transfer_address, reservation.request_id, reservation.block_ids,
                        reservation.num_skip_blocks, reservation.transfer_token)


def first_token_request(request_id: str, reservation) -> GenerateRequest:
    return GenerateRequest(request_id, PROMPT, SamplingParams(temperature=0, max_tokens=1), kv_send=send_to(reservation))


@contextlib.asynccontextmanager
async def started(*engines: AsyncEngine):
    for engine in engines:
        await engine.start()
    try:
        yield
    finally:
        for engine in engines:
            await engine.stop()


def pair(folder, **kwargs) -> tuple[AsyncEngine, AsyncEngine]:
    return (AsyncEngine(connected_llm(folder, KVConnectorRole.PRODUCER, **kwargs).engine),
            AsyncEngine(connected_llm(folder, KVConnectorRole.CONSUMER, **kwargs).engine))


def assert_whole(*engines: AsyncEngine) -> None:
    for engine in engines:
        load = engine.load()
        assert (load.num_free_blocks, load.num_waiting, load.num_running, load.num_reserved) == \
            (engine.info.num_blocks, 0, 0, 0)


def test_info_describes_the_engine(tiny_llama_folder):
    prefill, decode = pair(tiny_llama_folder)
    assert (decode.info.num_blocks, decode.info.cache.block_size, decode.info.cache.prefix_hash_algo) == (32, 16, "sha256")
    assert decode.info.cache.model_id == tiny_llama_folder.name and decode.info.cache.dtype == "float32"
    assert decode.info.kv_transfer_address.startswith("memory:") and prefill.info.kv_transfer_address == ""
    assert decode.info.weight_bytes > 0 and decode.info.kv_pool_bytes > 0


def test_a_disaggregated_request_equals_a_local_one(tiny_llama_folder):
    local = connected_llm(tiny_llama_folder).generate([list(PROMPT)], GREEDY)[0].token_ids
    prefill, decode = pair(tiny_llama_folder)

    async def scenario():
        async with started(prefill, decode):
            reservation = await decode.reserve_kv(GenerateRequest("r", PROMPT, GREEDY))
            assert (len(reservation.block_ids), reservation.num_skip_blocks) == (3, 0)
            first, output = await collect(prefill.generate(first_token_request("r:prefill", reservation)))
            assert not first.finished and first.token_ids == output.token_ids  # the token, before the send ended
            assert output.kv_transfer.num_bytes > 0
            await asyncio.wait_for(decode.wait_kv("r"), 30)
            await decode.wait_kv("r")  # arrived: returns at once
            outputs = await collect(decode.generate_reserved("r", output.outputs[0].token_ids[0], None))
            assert outputs[-1].outputs[0].token_ids == local
            status = await decode.status()
            assert (status.kv_transfer.received.num_transfers, status.num_requests_finished) == (1, 1)
            assert (await prefill.status()).kv_transfer.sent.total_bytes == output.kv_transfer.num_bytes
            assert_whole(prefill, decode)
    asyncio.run(scenario())


def test_a_failed_transfer_raises_on_both_sides_and_frees_the_producers_blocks(tiny_llama_folder):
    prefill, decode = pair(tiny_llama_folder)
    prefill.transport.core.connector.fail_next_sends = 1  # white box: inject the failure

    async def scenario():
        async with started(prefill, decode):
            reservation = await decode.reserve_kv(GenerateRequest("r", PROMPT, GREEDY))
            waiting = asyncio.ensure_future(decode.wait_kv("r"))
            with pytest.raises(KVTransferFailedError, match="injected"):
                await collect(prefill.generate(first_token_request("r:prefill", reservation)))
            with pytest.raises(KVTransferFailedError):
                await asyncio.wait_for(waiting, 30)
            assert_whole(prefill)
            await collect(prefill.generate(first_token_request("r:prefill", reservation)))  # the retry
            await asyncio.wait_for(decode.wait_kv("r"), 30)
            assert await decode.release_kv("r") and not await decode.release_kv("r")
            assert_whole(prefill, decode)
    asyncio.run(scenario())


def test_reserve_refuses_when_full_and_bad_input_names_the_field(tiny_llama_folder):
    _, decode = pair(tiny_llama_folder, num_blocks=4)

    async def scenario():
        async with started(decode):
            await decode.reserve_kv(GenerateRequest("a", PROMPT, GREEDY))
            assert (decode.load().num_reserved, decode.load().num_free_blocks) == (1, 1)  # load() counts a call at once
            with pytest.raises(CapacityError):
                await decode.reserve_kv(GenerateRequest("b", PROMPT, GREEDY))
            with pytest.raises(InvalidRequestError, match="^request_id"):
                await decode.reserve_kv(GenerateRequest("a", PROMPT, GREEDY))
            with pytest.raises(InvalidRequestError, match="^request_id"):
                await decode.wait_kv("b")
            with pytest.raises(InvalidRequestError, match="has not arrived"):
                await collect(decode.generate_reserved("a", 1, None))
            assert await decode.release_kv("a")
            assert_whole(decode)
    asyncio.run(scenario())


def test_a_consumer_refuses_to_send(tiny_llama_folder):
    _, decode = pair(tiny_llama_folder)
    send = KVSendParams("memory:none", "c", (1, 2, 3), 0, b"")

    async def scenario():
        async with started(decode):
            with pytest.raises(InvalidRequestError, match="^kv_send"):
                await collect(decode.generate(GenerateRequest("c", PROMPT, GREEDY, kv_send=send)))
            assert_whole(decode)
    asyncio.run(scenario())


def test_kv_events_report_stored_blocks_then_a_snapshot_when_asked(tiny_llama_folder):
    engine = AsyncEngine(connected_llm(tiny_llama_folder).engine)

    async def scenario():
        async with started(engine):
            await collect(engine.generate(GenerateRequest("a", PROMPT, GREEDY)))
            events = await engine.kv_events()
            assert len(events.stored) == 2 and not events.removed and not events.is_snapshot
            assert (await engine.kv_events()).stored == ()
            snapshot = await engine.kv_events(snapshot=True)
            assert snapshot.is_snapshot and sorted(snapshot.stored) == sorted(events.stored)
    asyncio.run(scenario())
