"""The typed engine API that services use, and nothing else (issue 9).

One implementation (shared.engine.frontend.EngineFrontend) serves this protocol over two core
transports: the scheduler, executor and KV connector step on a thread of the service process
(AsyncEngine; tests, offline tools) or in a child process (CoreProcessClient), reached over
ZeroMQ with typed msgspec messages either way; the client keeps detokenization, stop strings
and streaming on the service's event loop.

A service never reaches past this API into the executor, block pool, KV cache or scheduler,
and never runs arbitrary functions on the engine's thread. Everything below crosses a process
boundary as plain data.

Roles of a disaggregated pair, through the KV connector (shared.kv_transfer):
- prefill (producer): `generate` with `GenerateRequest.kv_send` computes the prompt, samples
  the first token, then the connector ships the prompt's KV to the decode instance before the
  final output is emitted; the blocks are held until the send ends and freed after it (or on
  abort/failure). The final output's `kv_transfer` says what moved; a failed send raises
  KVTransferFailedError from the stream.
- peer reuse: a puller reserves a prefix (`reserve_kv`), a holder sends the blocks it holds
  into that reservation (`send_cached`), and the puller keeps them as prefix-cache entries
  (`release_kv(keep_arrived=True)`) before its prompt runs.
- decode (consumer): `reserve_kv` allocates blocks for a prompt whose KV arrives from
  elsewhere (reusing the decode side's own prefix-cache hits, which need not be sent) and arms
  the connector to accept exactly those blocks with the reservation's token, until its lease
  runs out (`renew_kv` extends it); `wait_kv` completes when they arrived (raises
  KVTransferFailedError after a failed transfer, after which the connector still accepts a
  retry); `generate_reserved` starts decoding from the prefill's first token;
  `prefill_reserved` computes the prompt here after all (a prompt short enough not to be
  worth a prefill hop); `release_kv` frees a reservation that will not be decoded. The
  engine's scheduler owns the reservation (shared.core.remote_kv draws its life); what
  happens to it reaches the service as `ReservationEvent`s (`on_reservation_event`).
"""

import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from shared.engine_api.errors import CapacityError, EngineDeadError, KVTransferFailedError, RequestFailedError
from shared.engine_api.outputs import RequestOutput, SampledLogprobs
from shared.kv_tier.stats import KVTierStats
from shared.kv_transfer.types import KVConnectorStats, KVSendParams, KVTransferResult
from shared.lora.request import LoRARequest
from shared.model.compute_paths import ComputePaths
from shared.sampling.params import SamplingParams

__all__ = [
    "CachedSend", "CacheSettings", "CapacityError",
    "EngineClient", "EngineDeadError", "EngineInfo", "EngineLoad", "EngineMemory",
    "EngineStatus", "GenerateRequest", "KVCacheEvents", "KVReservation", "KVSendParams", "KVTransferFailedError",
    "NOT_HELD_FIELD", "OutputObserver", "KVTierStats", "ReservationEvent", "ReservationEventKind",
    "KVTransferResult", "RequestFailedError", "SpecDecodeCounts",
]


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    cache_salt: str | None = None
    # Migration: the prompt's last tokens are outputs generated elsewhere already.
    num_resumed_output_tokens: int = 0
    kv_send: KVSendParams | None = None
    # The LoRA adapter it runs with (None: the base model).
    lora_request: LoRARequest | None = None


@dataclass(frozen=True)
class KVReservation:
    """Consumer side: the blocks reserved for a prompt whose KV a producer will send."""
    request_id: str
    block_ids: tuple[int, ...]          # the whole prompt's block table
    num_cached_tokens: int              # prompt tokens the consumer already holds
    num_skip_blocks: int                # = blocks already held: the producer skips these
    transfer_address: str               # where the producer connects
    transfer_token: bytes


class ReservationEventKind(str, enum.Enum):
    ARRIVED = "arrived"                  # a transfer into the reservation completed
    TRANSFER_FAILED = "transfer_failed"  # one failed; an earlier arrival is undone, a retry accepted
    EXPIRED = "expired"                  # its lease ran out: the engine freed its blocks


@dataclass(frozen=True)
class ReservationEvent:
    """What happened to a reservation, as the engine's scheduler saw it (in order per engine)."""
    request_id: str
    kind: ReservationEventKind
    error: str | None = None             # the failed transfer's
    num_failed_transfers: int = 0        # into this reservation so far


@dataclass(frozen=True)
class CachedSend:
    """Holder side of a peer pull: send blocks of a prefix this engine holds (its pool or its
    KV tiers) into a puller's reservation."""
    request_id: str                     # the puller's reservation
    prompt_token_ids: tuple[int, ...]   # the prefix: whole blocks
    cache_salt: str | None
    num_skip_blocks: int                # leading blocks the puller holds already (not sent)
    remote_address: str                 # the puller's KV receiver
    remote_block_ids: tuple[int, ...]   # the reservation's block table, one per prefix block
    transfer_token: bytes


# The field of the InvalidRequestError `send_cached` raises when the engine no longer holds every
# block asked for (the puller computes the prefix itself instead).
NOT_HELD_FIELD = "held_blocks"


@dataclass(frozen=True)
class EngineLoad:
    num_waiting: int
    num_running: int
    num_reserved: int                   # waiting for their KV from elsewhere
    num_free_blocks: int
    num_total_blocks: int
    # Names of the LoRA adapters the model runner holds in memory (a request for one of them
    # skips reading it from disk), sorted.
    resident_lora_adapters: tuple[str, ...] = ()
    # Running requests still without a first token (their prompt is being computed): with
    # num_waiting, the prompts a gateway's admission limit counts. A colocated instance's other
    # running requests are decoding and do not count.
    num_prefilling: int = 0
    # Names of the LoRA adapters of the running and of the waiting requests, sorted (GAIE's
    # vllm:lora_requests_info labels).
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()


@dataclass(frozen=True)
class SpecDecodeCounts:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()


@dataclass(frozen=True)
class EngineMemory:
    """Bounded caches and per-request state inside the engine, for the memory metrics:
    name -> (entries, limit, bytes); -1 where unknown or unbounded."""
    caches: dict[str, tuple[int, int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineStatus:
    """Counters and load, taken in one snapshot between steps."""
    load: EngineLoad
    num_held: int                       # finished, blocks kept while the connector sends them
    num_prompt_tokens: int              # of requests started (prefix hits and received KV included)
    num_prompt_tokens_computed: int
    num_cached_prompt_tokens: int       # over finished requests
    num_generation_tokens: int
    num_requests_finished: int
    num_prefix_cache_queries: int
    num_prefix_cache_hits: int
    num_preemptions: int
    num_steps: int
    spec_decode: SpecDecodeCounts | None = None
    kv_transfer: KVConnectorStats = field(default_factory=KVConnectorStats)
    memory: EngineMemory = field(default_factory=EngineMemory)
    # The KV tiers below the pool (host, file), as this instance uses them.
    kv_tiers: tuple[KVTierStats, ...] = ()
    # KV-cache events (and batches of them) dropped before they were sent (shared.kv_events).
    num_kv_events_dropped: int = 0


@dataclass(frozen=True)
class CacheSettings:
    """What every process of a deployment must agree on to share KV (registered in Redis)."""
    model_id: str
    block_size: int
    prefix_hash_algo: str
    dtype: str
    kv_layout: str
    tensor_parallel_size: int = 1


@dataclass(frozen=True)
class EngineInfo:
    """Fixed once the engine is loaded."""
    cache: CacheSettings
    num_blocks: int
    vocab_size: int
    max_model_len: int
    weight_bytes: int
    kv_pool_bytes: int
    kv_transfer_address: str = ""       # the KV connector's consumer address ("" if none)
    kv_tier_id: str = ""                # this host's KV tier in the prefix index ("" if none)
    compute: ComputePaths | None = None  # which kernels the model runs (benchmarks print it)


@dataclass(frozen=True)
class KVCacheEvents:
    """Prefix-cache changes since the previous drain (the prefix publisher's input); with
    `is_snapshot`, `stored` is every cached hash and the consumer replaces what it had. The
    `tier_*` fields say the same of the host's KV tiers, as far as this instance changed them
    (with `is_tier_snapshot`, `tier_stored` is everything they hold)."""
    stored: tuple[bytes, ...] = ()
    removed: tuple[bytes, ...] = ()
    is_snapshot: bool = False
    tier_stored: tuple[bytes, ...] = ()
    tier_removed: tuple[bytes, ...] = ()
    is_tier_snapshot: bool = False


class OutputObserver(Protocol):
    """Sees plain outputs, never engine state; must be quick (the client calls it on its event
    loop, in the order below: see shared.engine.frontend)."""

    def on_start(self, request_id: str) -> None:
        """The engine took a streamed request (or, decode role, started it from its
        reservation): called before its first outputs; never for a request it refused."""

    def on_outputs(self, outputs: list[RequestOutput]) -> None:
        """Outputs about to be streamed."""

    def on_stop(self, request_id: str) -> None:
        """The request's stream closed, finished or not (once per on_start)."""


class EngineClient(Protocol):
    info: EngineInfo
    # Set by the service before requests flow: sees each stream's start, outputs and end
    # (OutputObserver, above); and is told once if the engine fails.
    observer: OutputObserver | None
    on_failure: Callable[[BaseException], None] | None
    # Set by a decode service: told, on its event loop, what happens to each reservation (the
    # scheduler owns the state; a lease that ran out there arrives as EXPIRED).
    on_reservation_event: Callable[[ReservationEvent], None] | None

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    @property
    def is_alive(self) -> bool: ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """Validate (InvalidRequestError), prepare (grammar compile, off the step loop), queue,
        and stream outputs until the request finishes; closing the stream early aborts it."""

    async def abort(self, request_id: str) -> None: ...

    async def reserve_kv(self, request: GenerateRequest, lease_s: float | None = None) -> KVReservation:
        """Reserve blocks until `lease_s` from now (None: until released); CapacityError when
        there is no room (the caller tries another instance)."""

    async def renew_kv(self, request_id: str, lease_s: float) -> bool:
        """Move a reservation's lease to end `lease_s` from now; False if it has ended."""

    async def wait_kv(self, request_id: str) -> None:
        """Returns once the reservation's KV arrived (at once if it already has);
        KVTransferFailedError when a transfer failed (the connector waits for a retry) or the
        lease ran out; InvalidRequestError when there is no such reservation."""

    def generate_reserved(self, request_id: str, first_token_id: int,
                          first_logprobs: SampledLogprobs | None) -> AsyncIterator[RequestOutput]:
        """Decode a reservation whose KV arrived, from the producer's first token."""

    def prefill_reserved(self, request_id: str) -> AsyncIterator[RequestOutput]:
        """Compute a reservation's prompt in this engine instead of receiving its KV
        (conditional disaggregation: its steps give the running decodes their tokens first,
        then prompt chunks), then decode it; streams from its first token."""

    async def release_kv(self, request_id: str, keep_arrived: bool = False) -> bool:
        """Free a reservation that will not be decoded; False if there is none. With
        `keep_arrived`, KV that arrived into it joins the prefix cache first (a peer pull)."""

    async def send_cached(self, send: CachedSend) -> int:
        """Holder side of a peer pull: start sending the prefix's blocks this engine holds;
        the number of blocks on their way (InvalidRequestError when it lacks some)."""

    def load(self) -> EngineLoad:
        """Latest snapshot, without a round trip (heartbeats, routing, drain); once a call
        (reserve_kv, release_kv, ...) returns, it counts what that call did."""

    def latest_status(self) -> EngineStatus:
        """Latest status without a round trip (metrics scrapes, on any thread); at most a step old."""

    async def status(self) -> EngineStatus:
        """A consistent snapshot taken between steps."""

    async def kv_events(self, snapshot: bool = False) -> KVCacheEvents:
        """Prefix-cache changes since the previous call; a snapshot when asked, or when the
        engine dropped events nobody drained (KVCacheEvents.is_snapshot)."""


def raise_if_failed(request_id: str, output: RequestOutput) -> None:
    """What a client's stream raises for an output: the request failed, or its KV send did."""
    if output.error is not None:
        raise RequestFailedError(output.error)
    if output.kv_transfer_error is not None:
        raise KVTransferFailedError(f"KV transfer of {request_id!r}: {output.kv_transfer_error}")
