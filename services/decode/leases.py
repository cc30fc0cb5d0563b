"""ReservationLeases: a decode instance's leases on its reservations, and nothing else.

The engine's scheduler owns each reservation (shared.core.remote_kv draws its life): its
blocks, the KV arriving into them and the transfers that failed, its deadline and its release.
This service keeps the lease, its contract with the gateway: Reserve grants one (the engine
holds the blocks until `lease_s` from now), Renew extends it while the prompt is queued or
running on a prefill instance (the engine moves the deadline), Release, Decode and
PrefillLocally end it, and the engine's EXPIRED event says it ran out there. Leases are
mirrored into Redis (`pdserve status`) by the LeaseTable, from here only. A tracing span per
lease runs from Reserve until it ends.
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import grpc

from shared.cluster.leases import LeaseTable
from shared.engine_api.client import (EngineClient, EngineDeadError, GenerateRequest, KVReservation, KVTransferFailedError,
                                  ReservationEvent, ReservationEventKind)
from shared.errors import InvalidRequestError
from shared.tracing import NULL_SPAN, record_failure, start_span
from services.rpc.errors import ServiceError

logger = logging.getLogger(__name__)

# A Decode that finds its KV not arrived yet waits this long for the engine to note it.
ARRIVAL_GRACE_S = 5.0


@dataclass
class Lease:
    reservation: KVReservation
    num_prompt_tokens: int  # the prompt's, resumed outputs included
    # Tracing: from Reserve until Decode takes it (or it is released, or it expires).
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


class ReservationLeases:
    def __init__(self, engine: EngineClient, table: LeaseTable):
        self.engine = engine
        self.table = table
        self.num_lease_expiries = 0
        self._leases: dict[str, Lease] = {}
        engine.on_reservation_event = self._on_event

    def __len__(self) -> int:
        return len(self._leases)

    async def reserve(self, request: GenerateRequest, lease_s: float) -> KVReservation:
        """Reserve blocks under a lease (CapacityError when full); freed if cancelled meanwhile."""
        if request.request_id in self._leases:
            raise InvalidRequestError("request_id", f"{request.request_id!r} is already reserved")
        reservation = await self.engine.reserve_kv(request, lease_s)
        try:
            self._grant(reservation, len(request.prompt_token_ids), lease_s)
        except BaseException:
            await asyncio.shield(self.engine.release_kv(request.request_id))
            raise
        return reservation

    def get(self, request_id: str) -> Lease:
        """A lease not ended yet (NOT_FOUND if there is none)."""
        lease = self._leases.get(request_id)
        if lease is None:
            raise _not_found(request_id)
        return lease

    async def wait_for_kv(self, request_id: str, grace_s: float = ARRIVAL_GRACE_S) -> None:
        """Until the reservation's KV arrived. The engine notes an arrival between steps, so a
        Decode that follows the producer's answer at once may come first: it waits up to
        `grace_s` (through failed transfers: a retry may still deliver), then FAILED_PRECONDITION."""
        self.get(request_id)
        try:
            async with asyncio.timeout(grace_s):
                await self._until_arrived(request_id)
        except TimeoutError:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"the KV of {request_id!r} has not arrived (waited {grace_s:g} s)") from None
        except InvalidRequestError:  # the engine no longer holds it: it ran out just now
            raise _not_found(request_id) from None

    async def _until_arrived(self, request_id: str) -> None:
        while True:
            try:
                return await self.engine.wait_kv(request_id)
            except KVTransferFailedError:
                self.get(request_id)  # NOT_FOUND once the lease ran out; else wait for a retry

    def take(self, request_id: str) -> Lease:
        """Decode (or a local prefill) takes the reservation: its lease ends."""
        lease = self.get(request_id)
        self._end(lease, "taken")
        return lease

    async def release(self, request_id: str, why: str = "released") -> bool:
        """Free a reservation's blocks; False if it holds no lease."""
        lease = self._leases.get(request_id)
        if lease is None:
            return False
        self._end(lease, why)
        with contextlib.suppress(EngineDeadError):  # a dead engine holds nothing any more
            await self.engine.release_kv(request_id)
        return True

    async def renew(self, request_id: str, lease_s: float) -> bool:
        """Extend a lease that has not ended; False if there is none (or it ran out meanwhile)."""
        if request_id not in self._leases or not await self.engine.renew_kv(request_id, lease_s):
            return False
        return self.table.renew(request_id, lease_s) is not None

    async def release_all(self) -> None:
        for request_id in list(self._leases):
            await self.release(request_id)

    def forget_all(self) -> None:
        """The engine core died, and every reservation with it: drop the leases (there is
        nothing left to free in the engine)."""
        for lease in list(self._leases.values()):
            self._end(lease, "engine_died")

    def _grant(self, reservation: KVReservation, num_prompt_tokens: int, lease_s: float) -> None:
        lease = Lease(reservation, num_prompt_tokens, span=start_span(
            "decode.reservation", attributes={"pdserve.request_id": reservation.request_id,
                                              "pdserve.num_blocks": len(reservation.block_ids),
                                              "pdserve.num_cached_prompt_tokens": reservation.num_cached_tokens,
                                              "pdserve.lease_s": lease_s}))
        self.table.grant(reservation.request_id, lease.dst_block_ids, lease_s)
        self._leases[reservation.request_id] = lease

    def _end(self, lease: Lease, outcome: str, num_failed_transfers: int = 0) -> None:
        del self._leases[lease.request_id]
        self.table.release(lease.request_id)
        _end_span(lease, outcome, num_failed_transfers)

    def _on_event(self, event: ReservationEvent) -> None:
        """The engine's word on a reservation (on the event loop): a lease that ran out there
        ends here; transfers are noted on the lease's span."""
        lease = self._leases.get(event.request_id)
        if lease is None:
            return
        if event.kind == ReservationEventKind.EXPIRED:
            self.num_lease_expiries += 1
            logger.warning("lease of %s expired: %d blocks freed", event.request_id, len(lease.reservation.block_ids))
            self._end(lease, "lease_expired", event.num_failed_transfers)
        elif event.kind == ReservationEventKind.ARRIVED:
            lease.span.add_event("kv_received", {"pdserve.num_failed_transfers": event.num_failed_transfers})
        elif event.kind == ReservationEventKind.TRANSFER_FAILED:
            lease.span.add_event("kv_transfer_failed", {"pdserve.failure": "kv_transfer",
                                                        "message": (event.error or "")[:300]})
            logger.warning("KV transfer for %s failed (%s); waiting for a retry", event.request_id, event.error)


def _not_found(request_id: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.NOT_FOUND, f"no reservation for {request_id!r} (never made, released, "
                                                   "expired, or already decoding)")


def _end_span(lease: Lease, outcome: str, num_failed_transfers: int) -> None:
    """End the lease's span: taken by Decode, released, expired (a failure of its own kind,
    told apart from a failed transfer), or gone with the engine core."""
    lease_span = lease.span
    lease_span.set_attribute("pdserve.reservation.outcome", outcome)
    if outcome == "lease_expired":
        record_failure(lease_span, "DEADLINE_EXCEEDED", "the reservation's lease expired before Decode took it",
                       **{"pdserve.failure": "lease_expiry", "pdserve.num_failed_transfers": num_failed_transfers})
    elif outcome == "engine_died":
        record_failure(lease_span, "UNAVAILABLE", "the engine core died", **{"pdserve.failure": "engine"})
    lease_span.end()
