"""A KV send that times out, or is cancelled, while its UCX operations are still pending never
cancels them: each keeps its buffer (a chunk of the staging buffer, the ack's frame) until UCX
ends it, which the endpoint's abort does.

Before, the timeout (or the cancellation) reached the tasks the sender was awaiting (the ack
receive, and through asyncio.gather every chunk send): cancelled, they dropped their buffers
while UCX still pointed into them. A receiver stopped for 20 s (SIGSTOP) makes exactly that:
sends pending for the whole --kv-transfer-timeout-s; its prefill engine core then died of
SIGSEGV in the send path after the receiver resumed (docs/hung_instances.md).

A fake endpoint stands in for a connection whose peer never answers: its operations stay
pending until `abort()` ends them, as UCX's do.
"""

import asyncio

import pytest
import torch

from shared.kv_cache.layout import KVCacheLayout
from shared.kv_transfer.ucx import inflight
from shared.kv_transfer.ucx.chunks import DEFAULT_CHUNK_BYTES, choose_rows_per_chunk, plan_chunks
from shared.kv_transfer.ucx.protocol import KVTransferError
from shared.kv_transfer.ucx.sender import KVSender

LAYOUT = KVCacheLayout(num_layers=2, num_blocks=4, block_size=16, num_kv_heads=2, head_dim=64, dtype=torch.float32)
ADDRESS = "127.0.0.1:1"
BLOCKS = [0, 1, 2]


class UnansweredEndpoint:
    """A connection to a stopped peer: sends and receives wait until `abort()` ends them."""

    def __init__(self):
        self.closed = False
        self.num_posted = 0
        self.num_cancelled = 0  # operations whose task was cancelled: their buffers dropped
        self.num_ended_by_abort = 0
        self._pending: list[asyncio.Future] = []

    async def send(self, buffer, tag=None) -> None:
        await self._operation(buffer)

    async def recv(self, buffer, tag=None) -> None:
        await self._operation(buffer)

    async def _operation(self, buffer) -> None:
        self.num_posted += 1
        ended = asyncio.get_running_loop().create_future()
        self._pending.append(ended)
        try:
            await ended
        except asyncio.CancelledError:
            self.num_cancelled += 1
            raise
        except ConnectionAbortedError:
            self.num_ended_by_abort += 1
            memoryview(buffer)[0:1] = b"\0"  # UCX may still touch the buffer until now
            raise

    def abort(self) -> None:
        """Like UCX: every pending operation ends (with an error) a little later, not at once."""
        self.closed = True
        pending, self._pending = self._pending, []
        asyncio.get_running_loop().call_soon(
            lambda: [ended.set_exception(ConnectionAbortedError()) for ended in pending if not ended.done()])


async def drained() -> None:
    while inflight.num_lingering():
        await asyncio.sleep(0.01)


def run_send(give_up, timeout_s: float) -> UnansweredEndpoint:
    """Start a send on an unanswered connection, let `give_up(task, endpoint)` end it; the endpoint."""
    async def scenario() -> UnansweredEndpoint:
        sender = KVSender(timeout_s=timeout_s)
        endpoint = UnansweredEndpoint()
        sender._idle_endpoints.setdefault(ADDRESS, []).append(endpoint)  # white box: no real connection
        task = asyncio.ensure_future(sender.send(ADDRESS, "r", LAYOUT.allocate(), LAYOUT, BLOCKS, BLOCKS))
        await give_up(task, endpoint)
        await asyncio.wait_for(drained(), 30)
        return endpoint
    return asyncio.run(scenario())


def num_operations() -> int:
    """The ack's receive, the header's send and one send per chunk."""
    rows_per_chunk = choose_rows_per_chunk(LAYOUT, len(BLOCKS), DEFAULT_CHUNK_BYTES)
    return 2 + len(plan_chunks(LAYOUT, len(BLOCKS), rows_per_chunk, True))


async def time_out(task: asyncio.Task, endpoint: UnansweredEndpoint) -> None:
    with pytest.raises(KVTransferError, match="no answer within"):
        await task


async def cancel_once_posted(task: asyncio.Task, endpoint: UnansweredEndpoint) -> None:
    """Cancel the send (as the connector does when its request is withdrawn) while it waits for the ack."""
    while endpoint.num_posted < num_operations():
        assert not task.done(), task  # (its timeout is far away)
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("give_up, timeout_s", [(time_out, 0.5), (cancel_once_posted, 60.0)],
                         ids=["timeout", "cancelled"])
def test_a_send_given_up_leaves_its_pending_operations_to_the_abort(give_up, timeout_s):
    endpoint = run_send(give_up, timeout_s)
    assert endpoint.num_posted >= 2  # at least the ack's receive and the header: what the timeout found pending
    assert endpoint.num_cancelled == 0
    assert endpoint.num_ended_by_abort == endpoint.num_posted
