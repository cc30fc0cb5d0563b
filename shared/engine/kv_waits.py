"""Decode-role reservations as the engine client sees them: the prompt each was made for, and
its KV arrival as the callers of `wait_kv` see it (whether it has arrived, and the futures
waiting for it). Everything here is touched on the client's event loop only.

`KVArrivals` is the engine client's one place for this state: the core reports each transfer
into a reservation (`settle`), and the client asks it for the rest.
"""

import asyncio
from dataclasses import dataclass, field

from shared.engine_api.client import GenerateRequest, KVTransferFailedError
from shared.errors import InvalidRequestError


@dataclass
class ReservationWait:
    """A reservation in the core: the prompt it was made for (its output processing starts
    when it is decoded), and whether its KV arrived."""
    request: GenerateRequest
    has_arrived: bool = False
    waiters: list[asyncio.Future] = field(default_factory=list)

    def settle(self, error: str | None) -> None:
        """A transfer ended: waiters return (arrived) or get KVTransferFailedError. A failed
        transfer undoes an earlier arrival: it may have overwritten part of those blocks."""
        self.has_arrived = error is None
        self.fail(KVTransferFailedError(error) if error is not None else None)

    def fail(self, error: BaseException | None) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if waiter.done():
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    async def wait(self) -> None:
        if self.has_arrived:
            return
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self.waiters:
                self.waiters.remove(waiter)


class KVArrivals:
    """The reservations of one engine client, by request id."""

    def __init__(self):
        self._waits: dict[str, ReservationWait] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._waits

    def __len__(self) -> int:
        return len(self._waits)

    def add(self, request: GenerateRequest) -> None:
        self._waits[request.request_id] = ReservationWait(request)

    def discard(self, request_id: str) -> None:
        self._waits.pop(request_id, None)

    def take(self, request_id: str) -> GenerateRequest:
        """Forget a reservation that is being decoded (or prefilled here); its prompt.
        InvalidRequestError when there is none."""
        wait = self._waits.pop(request_id, None)
        if wait is None:
            raise InvalidRequestError("request_id", f"{request_id!r} has no reservation")
        return wait.request

    async def wait(self, request_id: str) -> None:
        """Until the reservation's KV arrived (at once if it has); KVTransferFailedError when a
        transfer into it failed; InvalidRequestError when there is no such reservation."""
        wait = self._waits.get(request_id)
        if wait is None:
            raise InvalidRequestError("request_id", f"{request_id!r} has no reservation")
        await wait.wait()

    def settle(self, request_id: str, error: str | None) -> None:
        """The core reports a transfer into `request_id` ended (`error`: why it failed)."""
        wait = self._waits.get(request_id)
        if wait is not None:
            wait.settle(error)

    def fail_all(self, error: BaseException) -> None:
        """The engine is gone: every waiter gets `error`, every reservation is forgotten."""
        waits, self._waits = self._waits, {}
        for wait in waits.values():
            wait.fail(error)
