"""UCXConnector: the KV connector over UCX (KVSender / KVReceiver), for disaggregated serving.

Named in the engine config as "shared.kv_transfer.ucx.connector:UCXConnector". It runs on the
process's transfer loop thread (shared.kv_transfer.ucx.loop_thread), never on the engine's thread
nor a service's loop: the engine calls its hooks from its step thread (or an engine-core
process), and the connector wakes the engine when a transfer ends.

Producer: `request_finished` reads the prompt's blocks (gathered from the ranks' shards
under tensor parallelism, on the engine thread) and sends those after `num_skip_blocks` to
the consumer; the blocks stay allocated until the send ends, whatever its outcome.
Consumer: `update_state_after_alloc` arms the receiver for the reservation's blocks and
token before the reservation is handed out; the receiver keeps accepting transfers into them
(a retried prefill after a failure; a second copy after a success, from a prefill retried
elsewhere after it died having sent) and the connector reports the end of each, until
`cancel` withdraws them: then no later transfer writes into those blocks. The connector keeps
no timer and no state of the reservation: the engine's scheduler owns it (shared.core.remote_kv).
"""

import asyncio
import functools
import logging
import threading
from collections.abc import Collection

from shared.kv_cache.blocks import blocks_for_tokens
from shared.kv_transfer.base import KVCacheAccess, KVConnector
from shared.kv_transfer.types import (
    FinishedTransfers, KVConnectorStats, KVSendParams, KVStagingUsage, KVTransferConfig, KVTransferCounts,
    KVTransferOutcome, KVTransferResult,
)
from shared.kv_transfer.ucx import loop_thread
from shared.kv_transfer.ucx.inflight import num_lingering
from shared.kv_transfer.ucx.protocol import KVTransferError
from shared.kv_transfer.ucx.stats import TransferCounters, TransferResult
from shared.kv_transfer.ucx.transport import KVReceiver, KVSender

logger = logging.getLogger(__name__)


class UCXConnector(KVConnector):
    def __init__(self, config: KVTransferConfig, kv_access: KVCacheAccess):
        super().__init__(config, kv_access)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sender: KVSender | None = None
        self.receiver: KVReceiver | None = None
        self._address = ""
        self._receiving: set[str] = set()  # armed and not withdrawn (the engine thread reads it)
        self._sending: set[str] = set()  # sends started and not ended (any thread reads it)
        self._send_tasks: dict[str, asyncio.Task] = {}  # on the transfer loop
        self._lock = threading.Lock()
        self._send_ended = threading.Condition(self._lock)
        self._sent: list[KVTransferOutcome] = []
        self._received: list[KVTransferOutcome] = []

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._loop = loop_thread.acquire()
        try:
            self._address = loop_thread.run(self._loop, self._start_ends())
        except BaseException:
            self._release_loop()
            raise

    async def _start_ends(self) -> str:
        config = self.config
        if config.role.is_producer:
            self.sender = KVSender(timeout_s=config.transfer_timeout_s, max_staging_bytes=config.max_staging_bytes)
        if not config.role.is_consumer:
            return ""
        self.receiver = KVReceiver(self.kv_access.kv_cache, self.kv_access.kv_cache_layout, host=config.host,
                                   port=config.port, max_staging_bytes=config.max_staging_bytes,
                                   discard_timeout_s=config.transfer_timeout_s)
        return await self.receiver.start()

    def shutdown(self) -> None:
        if self._loop is None:
            return
        try:
            loop_thread.run(self._loop, self._close_ends())
        finally:
            self._release_loop()

    async def _close_ends(self) -> None:
        for request_id in list(self._receiving):
            self._disarm(request_id)
        sends = list(self._send_tasks.values())
        for task in sends:
            task.cancel()
        await asyncio.gather(*sends, return_exceptions=True)
        if self.sender is not None:
            await self.sender.close()
        if self.receiver is not None:
            await self.receiver.close()

    def _release_loop(self) -> None:
        self._loop = None
        loop_thread.release()

    @property
    def address(self) -> str:
        return self._address

    def stats(self) -> KVConnectorStats:
        pools = [end.staging for end in (self.sender, self.receiver) if end is not None]
        staging = KVStagingUsage(sum(p.num_free_buffers for p in pools), sum(p.memory_bytes for p in pools),
                                 sum(p.max_free_bytes for p in pools))
        sender = self.sender
        return KVConnectorStats(sent=_counts(self.sender), received=_counts(self.receiver), staging=staging,
                                num_lingering=num_lingering(),
                                num_idle_endpoints=sender.num_idle_endpoints if sender else 0,
                                num_idle_addresses=sender.num_idle_addresses if sender else 0,
                                late_writes_refused=_refusals(self.receiver))

    # ---- consumer ------------------------------------------------------------------------

    def update_state_after_alloc(self, request_id: str, block_ids: list[int], num_external_tokens: int,
                                 transfer_token: bytes, adapter_key: str = "") -> None:
        block_size = self.kv_access.kv_cache_layout.block_size
        num_external_blocks = blocks_for_tokens(num_external_tokens, block_size)
        dst_block_ids = tuple(block_ids[len(block_ids) - num_external_blocks:])
        loop_thread.run(self._loop, self._arm(request_id, dst_block_ids, transfer_token, adapter_key))

    async def _arm(self, request_id: str, dst_block_ids: tuple[int, ...], transfer_token: bytes,
                   adapter_key: str) -> None:
        self.receiver.expect(request_id, dst_block_ids, transfer_token, adapter_key,
                             on_outcome=functools.partial(self._on_received, request_id))
        self._receiving.add(request_id)

    def _on_received(self, request_id: str, result: TransferResult | KVTransferError) -> None:
        """On the transfer loop: a transfer into `request_id`'s blocks ended."""
        if isinstance(result, KVTransferError):
            outcome = KVTransferOutcome(request_id, error=str(result))
        else:
            outcome = KVTransferOutcome(request_id, KVTransferResult(result.num_bytes, result.seconds))
        self._report_received(outcome)

    def _disarm(self, request_id: str) -> None:
        """On the transfer loop: after this, nothing more is written for `request_id`."""
        self._receiving.discard(request_id)
        self.receiver.withdraw(request_id)

    # ---- producer ------------------------------------------------------------------------

    def request_finished(self, request_id: str, block_ids: list[int], send: KVSendParams | None) -> bool:
        if send is None:
            return False
        source, layout, src_block_ids = self.kv_access.blocks_for_send(block_ids[send.num_skip_blocks:])
        with self._lock:
            self._sending.add(request_id)
        self._loop.call_soon_threadsafe(self._start_send, request_id, send, source, layout, src_block_ids)
        return True

    def _start_send(self, request_id: str, send: KVSendParams, source, layout, src_block_ids) -> None:
        """On the transfer loop; the task's end (whatever it is) is reported once."""
        task = asyncio.get_running_loop().create_task(self.sender.send(
            send.remote_address, send.remote_request_id, source, layout, src_block_ids,
            list(send.remote_block_ids[send.num_skip_blocks:]), send.transfer_token, send.adapter_key))
        self._send_tasks[request_id] = task
        task.add_done_callback(functools.partial(self._on_send_done, request_id))

    def _on_send_done(self, request_id: str, task: asyncio.Task) -> None:
        self._send_tasks.pop(request_id, None)
        if task.cancelled():
            outcome = KVTransferOutcome(request_id, error="the send was abandoned (request aborted)")
        elif task.exception() is not None:
            outcome = KVTransferOutcome(request_id, error=str(task.exception()))
        else:
            result = task.result()
            outcome = KVTransferOutcome(request_id, KVTransferResult(result.num_bytes, result.seconds))
        with self._lock:  # together: a waiter that finds the send ended finds its outcome too
            self._sending.discard(request_id)
            self._sent.append(outcome)
            self._send_ended.notify_all()
        self._wakeup()

    def _cancel_send(self, request_id: str) -> None:
        task = self._send_tasks.get(request_id)
        if task is not None:
            task.cancel()  # the sender aborts its endpoint; UCX buffers are kept until done

    # ---- both ----------------------------------------------------------------------------

    def cancel(self, request_id: str) -> None:
        if request_id in self._receiving:
            loop_thread.run(self._loop, _as_coroutine(self._disarm, request_id))
        if request_id in self._sending:
            self._loop.call_soon_threadsafe(self._cancel_send, request_id)

    def get_finished(self) -> FinishedTransfers:
        with self._lock:
            sent, self._sent = self._sent, []
            received, self._received = self._received, []
        return FinishedTransfers(tuple(sent), tuple(received))

    def wait_for_sends(self, request_ids: Collection[str], timeout_s: float) -> None:
        with self._send_ended:
            self._send_ended.wait_for(lambda: self._sending.isdisjoint(request_ids), timeout=timeout_s)

    def _report_received(self, outcome: KVTransferOutcome) -> None:
        with self._lock:
            self._received.append(outcome)
        self._wakeup()


async def _as_coroutine(fn, *args):
    return fn(*args)


def _counts(end) -> KVTransferCounts:
    counters: TransferCounters = end.counters if end is not None else TransferCounters()
    return KVTransferCounts(counters.num_transfers, counters.num_failed, counters.total_bytes,
                            counters.total_seconds)


def _refusals(receiver) -> dict[str, int]:
    if receiver is None:
        return {}
    refused = receiver.late_writes_refused
    return {"not_expected": refused.not_expected, "withdrawn": refused.withdrawn, "superseded": refused.superseded}
