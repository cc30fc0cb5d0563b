"""ReservationBook: a decode instance's reservations, from Reserve until Decode takes them.

Each reservation holds engine blocks (`EngineClient.reserve_kv`: the engine's KV connector is
armed for the blocks the prefill instance sends, those after the decode side's own
prefix-cache hits) under a lease (LeaseTable, mirrored to Redis). Decode takes a reservation
once its KV arrived; a local prefill (PrefillLocally) takes it to compute the prompt here
instead. A watcher task per reservation waits for the KV (`wait_kv`), counting failed
transfers: after one the connector waits for a retry on another prefill instance; it keeps
accepting after a success too, until Decode takes the reservation (a prefill that died after its transfer but before answering the
gateway is retried elsewhere, and that copy must be accepted). Release, lease expiry and
shutdown all free through `release`; the gateway `renew`s the lease while the prompt is queued
or running on a prefill instance.
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import grpc

from shared.cluster.leases import LeaseTable
from shared.engine_api.client import EngineClient, EngineDeadError, GenerateRequest, KVReservation, KVTransferFailedError
from shared.errors import InvalidRequestError
from shared.tracing import NULL_SPAN, record_failure, start_span
from services.common.errors import ServiceError

logger = logging.getLogger(__name__)

# A Decode that finds its KV not arrived yet waits this long for the engine to note it.
ARRIVAL_GRACE_S = 5.0


@dataclass
class PendingTransfer:
    reservation: KVReservation
    num_prompt_tokens: int  # the prompt's, resumed outputs included
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    num_failed_transfers: int = 0
    watcher: asyncio.Task | None = None
    # Tracing: from Reserve until Decode takes it (or it is released, or its lease expires).
    span: object = NULL_SPAN

    @property
    def request_id(self) -> str:
        return self.reservation.request_id

    @property
    def num_uncached_tokens(self) -> int:
        """Prompt tokens this instance would compute itself (a local prefill)."""
        return self.num_prompt_tokens - self.reservation.num_cached_tokens

    @property
    def dst_block_ids(self) -> tuple[int, ...]:
        """The blocks the prefill instance sends into (after the ones held already)."""
        return self.reservation.block_ids[self.reservation.num_skip_blocks:]


class ReservationBook:
    def __init__(self, engine: EngineClient, leases: LeaseTable):
        self.engine = engine
        self.leases = leases
        self.num_lease_expiries = 0
        self._pending: dict[str, PendingTransfer] = {}

    def __len__(self) -> int:
        return len(self._pending)

    async def reserve(self, request: GenerateRequest, lease_s: float) -> KVReservation:
        """Reserve blocks (CapacityError when full) and watch for their KV; freed if cancelled meanwhile."""
        if request.request_id in self._pending:
            raise InvalidRequestError("request_id", f"{request.request_id!r} is already reserved")
        reservation = await self.engine.reserve_kv(request)
        try:
            self._track(reservation, len(request.prompt_token_ids), lease_s)
        except BaseException:
            await asyncio.shield(self.engine.release_kv(request.request_id))
            raise
        return reservation

    async def take(self, request_id: str, arrival_grace_s: float = ARRIVAL_GRACE_S) -> PendingTransfer:
        """Hand a reservation whose KV has arrived to Decode; its lease ends. The engine
        notes an arrival between steps, so a Decode that follows the producer's answer at once
        may come first: it waits up to `arrival_grace_s` for the arrival."""
        pending = self._pending_or_not_found(request_id)
        if not pending.arrived.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pending.arrived.wait(), arrival_grace_s)
            pending = self._pending_or_not_found(request_id)  # released or expired meanwhile?
        if not pending.arrived.is_set():
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"the KV of {request_id!r} has not arrived "
                               f"({pending.num_failed_transfers} failed transfers)")
        return self._hand_over(pending)

    def pending(self, request_id: str) -> PendingTransfer:
        """A reservation not taken yet (NOT_FOUND if there is none)."""
        return self._pending_or_not_found(request_id)

    def take_to_compute(self, request_id: str) -> PendingTransfer:
        """Hand a reservation to a local prefill (its KV will not be awaited); its lease ends."""
        return self._hand_over(self._pending_or_not_found(request_id))

    def _hand_over(self, pending: PendingTransfer) -> PendingTransfer:
        del self._pending[pending.request_id]
        if pending.watcher is not None:
            pending.watcher.cancel()
        self.leases.release(pending.request_id)
        _end_span(pending, "taken")
        return pending

    def _pending_or_not_found(self, request_id: str) -> PendingTransfer:
        pending = self._pending.get(request_id)
        if pending is None:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no reservation for {request_id!r} (never made, "
                                                          "released, expired, or already decoding)")
        return pending

    async def release(self, request_id: str, why: str = "released") -> bool:
        """Free a reservation's blocks; False if there is none."""
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return False
        _end_span(pending, why)
        if pending.watcher is not None:
            pending.watcher.cancel()
        self.leases.release(request_id)
        with contextlib.suppress(EngineDeadError):  # a dead engine holds nothing any more
            await self.engine.release_kv(request_id)
        return True

    def renew(self, request_id: str, lease_s: float) -> bool:
        """Extend a reservation's lease that Decode has not taken yet; False if there is none."""
        if request_id not in self._pending:
            return False
        return self.leases.renew(request_id, lease_s) is not None

    async def expire_leases(self) -> int:
        """Release every reservation whose lease has run out; returns how many."""
        num_expired = 0
        for record in self.leases.expired():
            if await self.release(record.request_id, why="lease_expired"):
                num_expired += 1
                logger.warning("lease of %s expired: %d blocks freed", record.request_id, len(record.block_ids))
        self.num_lease_expiries += num_expired
        return num_expired

    async def release_all(self) -> None:
        for request_id in list(self._pending):
            await self.release(request_id)

    def forget_all(self) -> None:
        """The engine core died, and every reservation with it: drop them and their leases
        (there is nothing left to free in the engine)."""
        for request_id, pending in list(self._pending.items()):
            if pending.watcher is not None:
                pending.watcher.cancel()
            self.leases.release(request_id)
            _end_span(pending, "engine_died")
        self._pending.clear()

    def _track(self, reservation: KVReservation, num_prompt_tokens: int, lease_s: float) -> None:
        pending = PendingTransfer(reservation, num_prompt_tokens, span=start_span(
            "decode.reservation", attributes={"pdserve.request_id": reservation.request_id,
                                              "pdserve.num_blocks": len(reservation.block_ids),
                                              "pdserve.num_cached_prompt_tokens": reservation.num_cached_tokens,
                                              "pdserve.lease_s": lease_s}))
        self.leases.grant(reservation.request_id, pending.dst_block_ids, lease_s)
        pending.watcher = asyncio.get_running_loop().create_task(self._watch(pending))
        self._pending[reservation.request_id] = pending

    async def _watch(self, pending: PendingTransfer) -> None:
        """No timeout of its own: the (renewable) lease is the only clock; its expiry releases
        the reservation, which cancels this task."""
        while True:
            try:
                await self.engine.wait_kv(pending.request_id)
            except EngineDeadError:
                return  # the reservation died with the engine core (see forget_all)
            except KVTransferFailedError as error:
                pending.num_failed_transfers += 1
                pending.span.add_event("kv_transfer_failed", {"pdserve.failure": "kv_transfer",
                                                              "message": str(error)[:300]})
                logger.warning("KV transfer for %s failed (%s); waiting for a retry", pending.request_id, error)
                continue
            pending.arrived.set()
            pending.span.add_event("kv_received", {"pdserve.num_failed_transfers": pending.num_failed_transfers})
            return


def _end_span(pending: PendingTransfer, outcome: str) -> None:
    """End the reservation's span: taken by Decode, released, lease expired (a failure of its
    own kind, told apart from a failed transfer), or gone with the engine core."""
    reservation_span = pending.span
    reservation_span.set_attribute("pdserve.reservation.outcome", outcome)
    if outcome == "lease_expired":
        record_failure(reservation_span, "DEADLINE_EXCEEDED", "the reservation's lease expired before Decode took it",
                       **{"pdserve.failure": "lease_expiry",
                          "pdserve.num_failed_transfers": pending.num_failed_transfers})
    elif outcome == "engine_died":
        record_failure(reservation_span, "UNAVAILABLE", "the engine core died", **{"pdserve.failure": "engine"})
    reservation_span.end()
