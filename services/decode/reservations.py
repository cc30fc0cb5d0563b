"""ReservationBook: a decode instance's reservations, from Reserve until Decode takes them.

Each reservation holds engine blocks under a lease (LeaseTable, mirrored to Redis) and an
armed KVReceiver expectation for the blocks the prefill instance sends (those after the
decode side's own prefix-cache hits). A watcher task per reservation marks the KV as arrived,
or re-arms the expectation after a failed transfer so that a prefill retried on another
instance can deliver. It re-arms after a success too, until Decode takes the reservation: a
prefill instance that died after its KV arrived but before it answered the gateway is retried
elsewhere, and that retry's transfer (the same prompt's KV again) must be accepted. Release, lease expiry and shutdown all free through `release`; the
gateway `renew`s the lease while the prompt is queued or running on a prefill instance.
"""

import asyncio
import logging
import secrets
from dataclasses import dataclass, field

import grpc

from shared.cluster.leases import LeaseTable
from shared.engine.async_engine import AsyncEngine
from shared.engine.llm_engine import Reservation
from shared.errors import InvalidRequestError
from shared.sampling.params import SamplingParams
from shared.transfer.ucx_transport import KVReceiver, KVTransferError
from services.common.errors import ServiceError

logger = logging.getLogger(__name__)


TRANSFER_TOKEN_BYTES = 16


@dataclass
class PendingTransfer:
    request_id: str
    dst_block_ids: tuple[int, ...]
    # Random per reservation; the prefill's KV transfer must present it (via the gateway).
    transfer_token: bytes = field(default_factory=lambda: secrets.token_bytes(TRANSFER_TOKEN_BYTES))
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    num_failed_transfers: int = 0
    watcher: asyncio.Task | None = None


class ReservationBook:
    def __init__(self, engine: AsyncEngine, receiver: KVReceiver, leases: LeaseTable):
        self.engine = engine
        self.receiver = receiver
        self.leases = leases
        self.num_lease_expiries = 0
        self._pending: dict[str, PendingTransfer] = {}

    def __len__(self) -> int:
        return len(self._pending)

    async def reserve(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                      cache_salt: str | None, lease_s: float, num_resumed: int = 0) -> Reservation:
        """Reserve blocks (CapacityError when full) and arm the receiver; freed if cancelled meanwhile."""
        if request_id in self._pending:
            raise InvalidRequestError("request_id", f"{request_id!r} is already reserved")
        engine = self.engine.engine
        await self.engine.prepare(params)
        made: list[Reservation] = []

        def reserve() -> Reservation:
            made.append(engine.reserve_request(prompt_token_ids, params, request_id, cache_salt, num_resumed))
            return made[0]

        def abort_if_made() -> None:  # queued after reserve(), so `made` is final when it runs
            if made:
                engine.abort_request(request_id)

        try:
            reservation = await self.engine.call(reserve)
            self._track(request_id, reservation, lease_s)
        except BaseException:
            if request_id not in self._pending:
                self.engine.submit(abort_if_made)
            raise
        return reservation

    def transfer_token(self, request_id: str) -> bytes:
        """The token a KV transfer for this reservation must present."""
        return self._pending[request_id].transfer_token

    def take(self, request_id: str) -> PendingTransfer:
        """Hand a reservation whose KV has arrived to Decode; its lease ends."""
        pending = self._pending.get(request_id)
        if pending is None:
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no reservation for {request_id!r} (never made, "
                                                          "released, expired, or already decoding)")
        if not pending.arrived.is_set():
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"the KV of {request_id!r} has not arrived "
                               f"({pending.num_failed_transfers} failed transfers)")
        del self._pending[request_id]
        if pending.watcher is not None:
            pending.watcher.cancel()
        self.receiver.withdraw(request_id)
        self.leases.release(request_id)
        return pending

    async def release(self, request_id: str) -> bool:
        """Free a reservation's blocks; False if there is none."""
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return False
        if pending.watcher is not None:
            pending.watcher.cancel()
        self.receiver.withdraw(request_id)
        self.leases.release(request_id)
        await self.engine.call(self.engine.engine.abort_request, request_id)
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
            if await self.release(record.request_id):
                num_expired += 1
                logger.warning("lease of %s expired: %d blocks freed", record.request_id, len(record.block_ids))
        self.num_lease_expiries += num_expired
        return num_expired

    async def release_all(self) -> None:
        for request_id in list(self._pending):
            await self.release(request_id)

    def _track(self, request_id: str, reservation: Reservation, lease_s: float) -> None:
        pending = PendingTransfer(request_id, tuple(reservation.block_ids[reservation.num_skip_blocks:]))
        self.receiver.expect(request_id, pending.dst_block_ids, pending.transfer_token)
        try:
            self.leases.grant(request_id, pending.dst_block_ids, lease_s)
        except BaseException:
            self.receiver.withdraw(request_id)
            raise
        pending.watcher = asyncio.get_running_loop().create_task(self._watch(pending))
        self._pending[request_id] = pending

    async def _watch(self, pending: PendingTransfer) -> None:
        while True:
            try:
                # No timeout of its own: the (renewable) lease is the only clock; its expiry
                # releases the reservation, which cancels this task.
                await self.receiver.wait(pending.request_id, None)
            except KVTransferError as error:
                pending.num_failed_transfers += 1
                logger.warning("KV transfer for %s failed (%s); waiting for a retry", pending.request_id,
                               str(error))
                self.receiver.expect(pending.request_id, pending.dst_block_ids, pending.transfer_token)
                continue
            self.engine.engine.executor.commit_received_blocks(list(pending.dst_block_ids))
            pending.arrived.set()
            self.receiver.expect(pending.request_id, pending.dst_block_ids, pending.transfer_token)
