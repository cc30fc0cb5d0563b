"""Per-transfer results and running counters, kept by KVSender and KVReceiver for metrics."""

from dataclasses import dataclass


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
