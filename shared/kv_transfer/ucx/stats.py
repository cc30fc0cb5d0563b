"""Per-transfer results and running counters, kept by KVSender and KVReceiver for metrics."""

import logging
from dataclasses import dataclass

from shared.pb.pdserve.v1 import kv_transfer_pb2 as pb


@dataclass(frozen=True)
class TransferResult:
    """One finished transfer: payload bytes moved and wall seconds taken on this side."""

    request_id: str
    num_bytes: int
    seconds: float

    @property
    def bytes_per_second(self) -> float:
        return self.num_bytes / self.seconds if self.seconds > 0 else 0.0


@dataclass
class TransferCounters:
    """Totals since start; `record` and `record_failure` are called once per transfer."""

    num_transfers: int = 0
    num_failed: int = 0
    total_bytes: int = 0
    total_seconds: float = 0.0

    def record(self, result: TransferResult) -> None:
        self.num_transfers += 1
        self.total_bytes += result.num_bytes
        self.total_seconds += result.seconds

    def record_failure(self) -> None:
        self.num_failed += 1


@dataclass
class LateWriteRefusals:
    """Transfers the receiver refused to write because they came too late: for a request no longer
    expected (aborted, finished, its reservation gone), withdrawn while its payload arrived, or
    superseded by a retry (an older generation). Each one would have written into blocks that
    may already belong to another request."""

    not_expected: int = 0
    withdrawn: int = 0
    superseded: int = 0

    @property
    def total(self) -> int:
        return self.not_expected + self.withdrawn + self.superseded


def count_transfer(counters: TransferCounters, header: pb.KVTransferHeader, seconds: float, verb: str,
                   log: logging.Logger) -> TransferResult:
    """One completed transfer of `header`'s payload on this side: counted, logged as `verb`
    ("sent", "received") with its rate on the caller's logger, and returned."""
    result = TransferResult(header.request_id, header.payload_bytes, seconds)
    counters.record(result)
    log.info("KV transfer %r %s: %d blocks, %d bytes in %.3f ms (%.2f GB/s)", result.request_id, verb,
             header.num_blocks, result.num_bytes, seconds * 1e3, result.bytes_per_second / 1e9)
    return result
