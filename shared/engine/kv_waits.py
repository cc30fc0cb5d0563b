"""KVWaits: an engine client's side of reservation events. The scheduler owns each
reservation's state (shared.core.remote_kv); the client only delivers the events the engine
reports (`ReservationEvent`, in engine order) to the `wait_kv` callers of that reservation, and
then to the service's listener. It holds no state of a reservation: a caller that starts
waiting registers first, then asks the engine whether the KV has arrived already, so an
arrival is seen either by the question or as an event, never missed.

Both engine clients (in-thread and core process) keep one, touched on one event loop only:

    waits.deliver(event)                     # each event, in the order the engine reported them
    await waits.wait(request_id, has_arrived)   # has_arrived(): asks the engine (a round trip)
    waits.fail_all(error)                    # the engine died
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable

from shared.engine_api.client import KVTransferFailedError, ReservationEvent, ReservationEventKind

logger = logging.getLogger(__name__)


class KVWaits:
    def __init__(self):
        # Told of every event after the waiters (a decode service's leases; None: nobody).
        self.listener: Callable[[ReservationEvent], None] | None = None
        self._waiters: dict[str, list[asyncio.Future]] = {}

    def deliver(self, event: ReservationEvent) -> None:
        """Waiters of the reservation return (its KV arrived) or get KVTransferFailedError (a
        transfer failed, or the reservation timed out); then the listener is told."""
        error = _error_of(event)
        for waiter in self._waiters.pop(event.request_id, []):
            if waiter.done():
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)
        if self.listener is not None:
            try:
                self.listener(event)
            except Exception:  # noqa: BLE001 - a listener's failure is its own, never the engine's
                logger.exception("reservation event listener failed on %s", event)

    async def wait(self, request_id: str, has_arrived: Callable[[], Awaitable[bool]]) -> None:
        """Until the reservation's KV arrived; `has_arrived()` asks the engine (raising
        InvalidRequestError when there is no such reservation)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(request_id, []).append(waiter)
        try:
            if not await has_arrived():
                await waiter
        finally:
            self._forget(request_id, waiter)

    def fail_all(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in (waiter for pending in waiters.values() for waiter in pending):
            if not waiter.done():
                waiter.set_exception(error)

    def _forget(self, request_id: str, waiter: asyncio.Future) -> None:
        if waiter.done() and not waiter.cancelled():
            waiter.exception()  # settled while the engine answered: its answer stands
        pending = self._waiters.get(request_id)
        if pending is not None and waiter in pending:
            pending.remove(waiter)
            if not pending:
                del self._waiters[request_id]


def _error_of(event: ReservationEvent) -> KVTransferFailedError | None:
    if event.kind == ReservationEventKind.ARRIVED:
        return None
    if event.kind == ReservationEventKind.EXPIRED:
        return KVTransferFailedError(f"the reservation {event.request_id!r} timed out: its lease ran out")
    return KVTransferFailedError(event.error or "the transfer failed")
