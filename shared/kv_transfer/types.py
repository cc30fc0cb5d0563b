"""Plain data a KV connector takes and reports: parameters, results, counters (all of it
crosses a process boundary as is)."""

import enum
from dataclasses import dataclass, field

DEFAULT_MAX_STAGING_BYTES = 256 << 20
# Loopback sends of a few MB end in ~5-25 ms (docs/autoscaling.md, section 6).
DEFAULT_SEND_WAIT_S = 0.03
# The longest one KV transfer may take, connection set-up included (docs/network_faults.md):
# a sender that cannot connect, or gets no answer, gives up after it and the request is
# retried on another prefill instance.
DEFAULT_TRANSFER_TIMEOUT_S = 10.0


class KVConnectorRole(enum.Enum):
    PRODUCER = "kv_producer"  # sends the KV of prompts it computed (prefill)
    CONSUMER = "kv_consumer"  # receives prompts' KV into reserved blocks (decode)
    BOTH = "kv_both"          # both (colocated)

    @property
    def is_producer(self) -> bool:
        return self in (KVConnectorRole.PRODUCER, KVConnectorRole.BOTH)

    @property
    def is_consumer(self) -> bool:
        return self in (KVConnectorRole.CONSUMER, KVConnectorRole.BOTH)


@dataclass(frozen=True)
class KVTransferConfig:
    """Which connector an engine runs, and its settings."""
    connector: str                      # "package.module:ClassName", a KVConnector subclass
    role: KVConnectorRole
    host: str = "127.0.0.1"             # the address a consumer advertises to producers
    port: int = 0                       # 0: a free port
    max_staging_bytes: int = DEFAULT_MAX_STAGING_BYTES
    # A producer's step that started sends waits up to this long for them to end, so their
    # requests' final outputs go out with it rather than after the next step (0: never wait).
    send_wait_s: float = DEFAULT_SEND_WAIT_S
    # A send gives up after this long (connection set-up included); a receiver drains a
    # rejected transfer's payload at most this long.
    transfer_timeout_s: float = DEFAULT_TRANSFER_TIMEOUT_S


@dataclass(frozen=True)
class KVSendParams:
    """Producer side: where this request's prompt KV goes once computed."""
    remote_address: str                 # the consumer connector's address ("host:port")
    remote_request_id: str              # the request's id on the consumer (its reservation)
    remote_block_ids: tuple[int, ...]   # one per prompt block, in prompt order
    num_skip_blocks: int                # leading blocks the consumer already holds (not sent)
    transfer_token: bytes               # the consumer's per-reservation secret
    adapter_key: str = ""               # the LoRA adapter the KV was computed with ("": the base model)


@dataclass(frozen=True)
class KVTransferResult:
    """What one completed transfer moved, as seen on this side."""
    num_bytes: int
    seconds: float


@dataclass(frozen=True)
class KVTransferOutcome:
    """A transfer that ended: `result` when it completed, else `error` says why."""
    request_id: str
    result: KVTransferResult | None = None
    error: str | None = None

    @property
    def is_ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class FinishedTransfers:
    """Transfers that ended since the previous `KVConnector.get_finished`."""
    sending: tuple[KVTransferOutcome, ...] = ()
    receiving: tuple[KVTransferOutcome, ...] = ()


@dataclass(frozen=True)
class KVTransferCounts:
    """Totals for one direction since start."""
    num_transfers: int = 0
    num_failed: int = 0
    total_bytes: int = 0
    total_seconds: float = 0.0


@dataclass(frozen=True)
class KVStagingUsage:
    """Host staging buffers kept for reuse (bounded in bytes)."""
    num_free_buffers: int = 0
    memory_bytes: int = 0
    max_free_bytes: int = 0


@dataclass(frozen=True)
class KVConnectorStats:
    sent: KVTransferCounts = field(default_factory=KVTransferCounts)
    received: KVTransferCounts = field(default_factory=KVTransferCounts)
    staging: KVStagingUsage = field(default_factory=KVStagingUsage)
    # Operations of abandoned transfers still pending in the transport (their buffers are kept).
    num_lingering: int = 0
    # The sender's connections kept for reuse, and the receiver addresses they lead to: a receiver
    # that died (or came back on the same address) must not leave them behind.
    num_idle_endpoints: int = 0
    num_idle_addresses: int = 0
    # Transfers the receiver refused to write, by reason ("not_expected", "withdrawn",
    # "superseded"): late writes that would have landed in blocks perhaps reused already.
    late_writes_refused: dict[str, int] = field(default_factory=dict)
