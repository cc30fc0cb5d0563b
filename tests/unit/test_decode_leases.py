"""ReservationLeases over the engine API (in-memory KV connector, one engine in both roles):
after the KV arrived, the connector keeps accepting it until Decode takes the reservation, so
a prefill retried on another instance (the first died after its transfer, before answering
the gateway) can deliver again instead of meeting "no transfer expected"; a failed transfer
is counted by the engine's scheduler and the reservation waits for a retry; starting the
decode stops the receiving. A lease that runs out in the engine ends here too (and leaves
the Redis mirror's table), with nothing of the reservation left anywhere."""

import asyncio
import contextlib

import pytest

from services.common.errors import ServiceError
from services.decode.leases import ReservationLeases
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


def events_of(engine: AsyncEngine) -> list:
    """The reservation events the engine reports, as the service's listener sees them."""
    seen = []
    listener = engine.on_reservation_event
    engine.on_reservation_event = lambda event: (seen.append(event), listener(event))
    return seen


def test_the_kv_may_arrive_again_until_decode_takes_the_reservation(tiny_llama_folder):
    llm = connected_llm(tiny_llama_folder, enable_prefix_caching=False)
    committed = []
    real_commit = llm.engine.core.executor.commit_received_blocks
    llm.engine.core.executor.commit_received_blocks = lambda ids: (committed.append(list(ids)), real_commit(ids))
    engine = AsyncEngine(llm.engine)

    async def scenario():
        await engine.start()
        try:
            leases = ReservationLeases(engine, LeaseTable("d0"))
            seen = events_of(engine)
            reservation = await leases.reserve(GenerateRequest("r1", PROMPT, SamplingParams(max_tokens=4)), 30.0)
            llm.engine.core.connector.fail_next_sends = 1
            assert "injected" in await prefill(engine, "p0", reservation)
            assert await prefill(engine, "p1", reservation) is None
            await asyncio.wait_for(leases.wait_for_kv("r1"), 30)
            assert [(event.kind.value, event.num_failed_transfers) for event in seen] == [("transfer_failed", 1),
                                                                                           ("arrived", 1)]
            assert committed == [list(reservation.block_ids)]
            assert await prefill(engine, "p2", reservation) is None  # the retried prefill's copy is accepted
            lease = leases.take("r1")
            assert lease.reservation == reservation and len(leases) == len(leases.table) == 0
            stream = engine.generate_reserved("r1", 5, None)
            outputs = [output async for output in stream]
            assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 4
            assert "request_id" in await prefill(engine, "p3", reservation)  # no longer received
            assert (await engine.status()).load.num_free_blocks == engine.info.num_blocks  # a round trip
        finally:
            await engine.stop()
    asyncio.run(scenario())


def test_a_lease_that_runs_out_in_the_engine_ends_here_and_frees_everything(tiny_llama_folder):
    llm = connected_llm(tiny_llama_folder, enable_prefix_caching=False)
    engine = AsyncEngine(llm.engine)

    async def scenario():
        await engine.start()
        try:
            leases = ReservationLeases(engine, LeaseTable("d0"))
            await leases.reserve(GenerateRequest("r1", PROMPT, SamplingParams(max_tokens=4)), 30.0)
            await leases.reserve(GenerateRequest("r2", PROMPT, SamplingParams(max_tokens=4)), 0.05)
            assert await leases.renew("r1", 30.0)
            expired = asyncio.Event()
            listener = engine.on_reservation_event
            engine.on_reservation_event = lambda event: (listener(event), expired.set())
            await asyncio.wait_for(expired.wait(), 30)  # the engine's idle loop wakes by the deadline
            assert leases.num_lease_expiries == 1
            assert len(leases) == len(leases.table) == 1 and leases.get("r1")
            assert not await leases.renew("r2", 30.0) and not await leases.release("r2")
            with pytest.raises(ServiceError, match="no reservation for 'r2'"):
                await leases.wait_for_kv("r2")
            assert await leases.release("r1")
            assert (await engine.status()).load.num_free_blocks == engine.info.num_blocks  # a round trip
        finally:
            await engine.stop()
    asyncio.run(scenario())
