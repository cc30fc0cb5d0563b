"""Where and how an engine publishes its KV-cache events (None in EngineConfig: it does not)."""

from dataclasses import dataclass

from shared.errors import ConfigurationError

ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")


@dataclass
class KVEventsConfig:
    # The PUB socket's endpoint: bound when it names a wildcard host (tcp://*:5557), ipc:// or
    # inproc://, connected to otherwise (a subscriber that binds), as vLLM does.
    endpoint: str
    # First frame of every message ("" by default; llm-d reads "kv@<pod>@<model>").
    topic: str = ""
    # The batches' data_parallel_rank: `pdserve up` numbers its instances in start order.
    data_parallel_rank: int = 0
    # Batches waiting for the publisher thread; past this they are dropped (and counted).
    max_queue_batches: int = 10_000
    # ZeroMQ's high-water mark of the PUB socket (messages held per slow subscriber).
    send_hwm: int = 100_000
    # "array" or "map" (shared.kv_events.wire: the event layout of older or newer vLLM).
    wire_format: str = "array"

    def __post_init__(self) -> None:
        if not self.endpoint.startswith(ENDPOINT_SCHEMES):
            raise ConfigurationError("kv_events_endpoint", f"must start with one of {ENDPOINT_SCHEMES}, "
                                                           f"got {self.endpoint!r}")
        if self.wire_format not in ("array", "map"):
            raise ConfigurationError("kv_events_format", f"must be array or map, got {self.wire_format!r}")
        if self.max_queue_batches < 1:
            raise ConfigurationError("kv_events_max_queue_batches", f"must be >= 1, got {self.max_queue_batches}")

    @property
    def binds(self) -> bool:
        return not self.endpoint.startswith("tcp://") or "*" in self.endpoint or "::" in self.endpoint


def offset_endpoint_port(endpoint: str, offset: int) -> str:
    """`tcp://host:P` -> `tcp://host:P+offset` (instance `offset` of a stack, as vLLM offsets by
    data-parallel rank); ipc:// and inproc:// endpoints get a `_dp<offset>` suffix."""
    if offset == 0:
        return endpoint
    if not endpoint.startswith("tcp://"):
        return f"{endpoint}_dp{offset}"
    host, _, port = endpoint.rpartition(":")
    if not port.isdigit():
        raise ConfigurationError("kv_events_endpoint", f"needs a port to offset, got {endpoint!r}")
    return f"{host}:{int(port) + offset}"
