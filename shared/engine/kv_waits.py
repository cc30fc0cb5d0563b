"""A decode-role reservation's KV arrival, as the callers of `wait_kv` see it: whether it has
arrived, and the futures waiting for it (touched on one event loop only). Both engine clients
(in-thread and core process) keep one per reservation."""

import asyncio
from dataclasses import dataclass, field

from shared.engine_api.client import KVTransferFailedError


@dataclass(kw_only=True)
class KVArrivalWait:
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
