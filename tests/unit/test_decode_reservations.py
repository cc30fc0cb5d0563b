"""ReservationBook over the engine API (in-memory KV connector, one engine in both roles):
after the KV arrived, the connector keeps accepting it until Decode takes the reservation, so
a prefill retried on another instance (the first died after its transfer, before answering
the gateway) can deliver again instead of meeting "no transfer expected"; a failed transfer
is counted and the reservation waits for a retry; starting the decode stops the receiving."""

import asyncio
import contextlib

from services.decode.reservations import ReservationBook
from shared.cluster.leases import LeaseTable
from shared.engine import SamplingParams
from shared.engine.async_engine import AsyncEngine
from shared.engine_api.client import GenerateRequest, KVSendParams
from tests.unit.kv_split import connected_llm

PROMPT = tuple(range(30, 67))


async def prefill(engine: AsyncEngine, request_id: str, reservation) -> str | None:
    """Prefill PROMPT with its KV sent into `reservation`; the transfer's error, or None."""
    send = KVSendParams(reservation.transfer_address, reservation.request_id, reservation.block_ids,
                        reservation.num_skip_blocks, reservation.transfer_token)
    request = GenerateRequest(request_id, PROMPT, SamplingParams(temperature=0, max_tokens=1), kv_send=send)
    try:
        async with contextlib.aclosing(engine.generate(request)) as outputs:
            async for _ in outputs:
                pass
    except Exception as error:  # noqa: BLE001 - the test looks at it
        return str(error)
    return None


async def settle(pending) -> None:
    async with asyncio.timeout(30):
        await pending.arrived.wait()


def test_the_kv_may_arrive_again_until_decode_takes_the_reservation(tiny_llama_folder):
    llm = connected_llm(tiny_llama_folder, enable_prefix_caching=False)
    committed = []
    real_commit = llm.engine.core.executor.commit_received_blocks
    llm.engine.core.executor.commit_received_blocks = lambda ids: (committed.append(list(ids)), real_commit(ids))
    engine = AsyncEngine(llm.engine)

    async def scenario():
        await engine.start()
        try:
            book = ReservationBook(engine, LeaseTable("d0"))
            reservation = await book.reserve(GenerateRequest("r1", PROMPT, SamplingParams(max_tokens=4)), 30.0)
            llm.engine.core.connector.fail_next_sends = 1
            assert "injected" in await prefill(engine, "p0", reservation)
            assert await prefill(engine, "p1", reservation) is None
            pending = book._pending["r1"]
            await settle(pending)
            assert pending.num_failed_transfers == 1
            assert committed == [list(reservation.block_ids)]
            assert await prefill(engine, "p2", reservation) is None  # the retried prefill's copy is accepted
            assert await book.take("r1") is pending
            stream = engine.generate_reserved("r1", 5, None)
            outputs = [output async for output in stream]
            assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 4
            assert "request_id" in await prefill(engine, "p3", reservation)  # no longer received
            assert engine.load().num_free_blocks == engine.info.num_blocks
        finally:
            await engine.stop()
    asyncio.run(scenario())
