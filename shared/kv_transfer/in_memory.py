"""InMemoryConnector: a KV connector between engines of one process, by plain tensor copies.

The reference implementation of the interface, for tests and single-process set-ups: a
consumer registers under an address ("memory:N"); a producer's `request_finished` copies the
blocks into the consumer's cache at once, on the producer's engine thread, and both sides
report the outcome at their next `get_finished`. The checks mirror the UCX connector's: the
consumer must expect the request, the token must match (a wrong token writes nothing and does
not disturb the consumer), the block counts must agree. `fail_next_sends` makes the next
sends fail after writing nothing, as a lost connection would.
"""

import hmac
import itertools
import threading
from dataclasses import dataclass

from shared.kv_cache.blocks import blocks_for_tokens
from shared.kv_transfer.base import KVCacheAccess, KVConnector
from shared.kv_transfer.types import (
    FinishedTransfers, KVConnectorStats, KVSendParams, KVTransferConfig, KVTransferCounts, KVTransferOutcome,
    KVTransferResult,
)

_consumers: dict[str, "InMemoryConnector"] = {}
_addresses = itertools.count()
_lock = threading.Lock()


@dataclass(frozen=True)
class _Expected:
    dst_block_ids: tuple[int, ...]
    transfer_token: bytes
    adapter_key: str = ""


class _Counts:
    def __init__(self):
        self.num_transfers = self.num_failed = self.total_bytes = 0

    def frozen(self) -> KVTransferCounts:
        return KVTransferCounts(self.num_transfers, self.num_failed, self.total_bytes, 0.0)


class InMemoryConnector(KVConnector):
    def __init__(self, config: KVTransferConfig, kv_access: KVCacheAccess):
        super().__init__(config, kv_access)
        self._address = f"memory:{next(_addresses)}" if config.role.is_consumer else ""
        self._expected: dict[str, _Expected] = {}
        self._sent: list[KVTransferOutcome] = []
        self._received: list[KVTransferOutcome] = []
        self._sent_counts, self._received_counts = _Counts(), _Counts()
        self.fail_next_sends = 0

    def start(self) -> None:
        if self._address:
            with _lock:
                _consumers[self._address] = self

    def shutdown(self) -> None:
        with _lock:
            _consumers.pop(self._address, None)
            self._expected.clear()

    @property
    def address(self) -> str:
        return self._address

    def stats(self) -> KVConnectorStats:
        return KVConnectorStats(sent=self._sent_counts.frozen(), received=self._received_counts.frozen())

    def update_state_after_alloc(self, request_id: str, block_ids: list[int], num_external_tokens: int,
                                 transfer_token: bytes, adapter_key: str = "") -> None:
        block_size = self.kv_access.kv_cache_layout.block_size
        num_external_blocks = blocks_for_tokens(num_external_tokens, block_size)
        with _lock:
            self._expected[request_id] = _Expected(tuple(block_ids[len(block_ids) - num_external_blocks:]),
                                                   transfer_token, adapter_key)

    def request_finished(self, request_id: str, block_ids: list[int], send: KVSendParams | None) -> bool:
        if send is None:
            return False
        outcome = self._send(request_id, block_ids[send.num_skip_blocks:], send)
        with _lock:
            self._sent.append(outcome)
            counts = self._sent_counts
            counts.num_transfers += outcome.is_ok
            counts.num_failed += not outcome.is_ok
            counts.total_bytes += outcome.result.num_bytes if outcome.is_ok else 0
        self._wakeup()
        return True

    def cancel(self, request_id: str) -> None:
        with _lock:
            self._expected.pop(request_id, None)

    def get_finished(self) -> FinishedTransfers:
        with _lock:
            sent, self._sent = self._sent, []
            received, self._received = self._received, []
        return FinishedTransfers(tuple(sent), tuple(received))

    # ---- a producer's copy into a consumer's cache ---------------------------------------------

    def _send(self, request_id: str, src_block_ids: list[int], send: KVSendParams) -> KVTransferOutcome:
        with _lock:
            consumer = _consumers.get(send.remote_address)
            expected = consumer._expected.get(send.remote_request_id) if consumer is not None else None
        dst_block_ids = tuple(send.remote_block_ids[send.num_skip_blocks:])
        problem = _problem(consumer, expected, send, dst_block_ids, len(src_block_ids))
        if problem is None and self.fail_next_sends > 0:
            self.fail_next_sends -= 1
            problem = "connection: lost (injected failure)"
        if problem is not None:
            if consumer is not None and expected is not None and not problem.startswith("transfer_token"):
                consumer._report_received(KVTransferOutcome(send.remote_request_id, error=problem))
            return KVTransferOutcome(request_id, error=problem)
        source, _, src_ids = self.kv_access.blocks_for_send(src_block_ids)
        consumer.kv_access.kv_cache[:, :, list(dst_block_ids)] = source[:, :, src_ids]
        num_bytes = self.kv_access.kv_cache_layout.bytes_per_block * len(src_block_ids)
        consumer._report_received(KVTransferOutcome(send.remote_request_id, KVTransferResult(num_bytes, 0.0)))
        return KVTransferOutcome(request_id, KVTransferResult(num_bytes, 0.0))

    def _report_received(self, outcome: KVTransferOutcome) -> None:
        with _lock:
            self._received.append(outcome)
            counts = self._received_counts
            counts.num_transfers += outcome.is_ok
            counts.num_failed += not outcome.is_ok
            counts.total_bytes += outcome.result.num_bytes if outcome.is_ok else 0
        self._wakeup()


def _problem(consumer, expected: _Expected | None, send: KVSendParams, dst_block_ids: tuple[int, ...],
             num_src_blocks: int) -> str | None:
    if consumer is None:
        return f"connection: no consumer at {send.remote_address!r}"
    if expected is None:
        return "request_id: no transfer expected"
    if not hmac.compare_digest(expected.transfer_token, send.transfer_token):
        return "transfer_token: missing or wrong for this reservation"
    if expected.adapter_key != send.adapter_key:
        return (f"adapter_key: sender computed with {send.adapter_key or 'the base model'}, the reservation is for "
                f"{expected.adapter_key or 'the base model'}")
    if dst_block_ids != expected.dst_block_ids or len(dst_block_ids) != num_src_blocks:
        return f"dst_block_ids: sender {list(dst_block_ids)}, receiver {list(expected.dst_block_ids)}"
    return None
