"""ReservationBook's transfer watcher with a fake KV receiver: after the KV arrived, the
expectation is armed again until Decode takes the reservation, so a prefill retried on another
instance (the first died after its transfer, before answering the gateway) can deliver again
instead of meeting "no transfer expected"; take() withdraws it."""

import asyncio
from types import SimpleNamespace

from services.decode.reservations import PendingTransfer, ReservationBook
from shared.cluster.leases import LeaseTable


class FakeReceiver:
    """expect/wait/withdraw like KVReceiver; `deliver` completes the armed expectation."""

    def __init__(self):
        self.expected: dict[str, asyncio.Future] = {}
        self.num_expects = 0

    def expect(self, request_id, dst_block_ids, transfer_token=b""):
        assert request_id not in self.expected, "already expected"
        self.expected[request_id] = asyncio.get_running_loop().create_future()
        self.num_expects += 1

    async def wait(self, request_id, timeout_s):
        try:
            return await self.expected[request_id]
        finally:
            self.withdraw(request_id)

    def withdraw(self, request_id, reason="was withdrawn"):
        self.expected.pop(request_id, None)

    def deliver(self, request_id) -> bool:
        future = self.expected.get(request_id)
        if future is None:
            return False  # "no transfer expected"
        future.set_result("ok")
        return True


class FakeExecutor:
    """Records the blocks the watcher commits once their KV arrived (multi-rank executors
    copy them to their ranks there)."""

    def __init__(self):
        self.committed: list[list[int]] = []

    def commit_received_blocks(self, block_ids):
        self.committed.append(list(block_ids))


def fake_engine(executor: FakeExecutor) -> SimpleNamespace:
    """The AsyncEngine shape the watcher reaches through: .engine.executor."""
    return SimpleNamespace(engine=SimpleNamespace(executor=executor))


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


def test_the_kv_may_arrive_again_until_decode_takes_the_reservation():
    async def scenario():
        receiver = FakeReceiver()
        executor = FakeExecutor()
        book = ReservationBook(engine=fake_engine(executor), receiver=receiver, leases=LeaseTable("d0"))
        book.leases.grant("r1", (3, 4), 30.0)
        pending = PendingTransfer("r1", (3, 4))
        receiver.expect("r1", pending.dst_block_ids)
        pending.watcher = asyncio.get_running_loop().create_task(book._watch(pending))
        book._pending["r1"] = pending
        await settle()
        assert receiver.deliver("r1")  # the first prefill's transfer
        await settle()
        assert pending.arrived.is_set()
        assert executor.committed == [[3, 4]]
        assert receiver.deliver("r1")  # the retried prefill's transfer is accepted too
        await settle()
        assert book.take("r1") is pending
        await settle()
        assert "r1" not in receiver.expected and pending.watcher.done()
        assert not receiver.deliver("r1")
    asyncio.run(scenario())
