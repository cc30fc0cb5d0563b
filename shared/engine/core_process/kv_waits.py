"""The service side's record of a decode-role reservation in the engine core: the prompt it
was made for (to start its output processing later) and whether its KV has arrived."""

import asyncio
from dataclasses import dataclass, field

from shared.engine.client import GenerateRequest, KVTransferFailedError


@dataclass
class ReservationWait:
    request: GenerateRequest
    has_arrived: bool = False
    waiters: list[asyncio.Future] = field(default_factory=list)

    def settle(self, error: str | None) -> None:
        """A transfer ended: waiters return (arrived) or get KVTransferFailedError."""
        self.has_arrived = self.has_arrived or error is None
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
