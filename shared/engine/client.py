"""The typed engine API that services use, and nothing else (issue 9).

Two implementations share this protocol:
- an in-thread client (the engine steps on a thread of the service process; tests, offline
  tools), and
- the engine-core process client: the scheduler, executor and KV connector run in a child
  process, reached over ZeroMQ with typed msgspec messages; the service process keeps
  tokenization, detokenization, stop strings and streaming.

A service never reaches past this API into the executor, block pool, KV cache or scheduler,
and never runs arbitrary functions on the engine's thread. Everything below crosses a process
boundary as plain data.

Roles of a disaggregated pair, through the KV connector (shared.kv_transfer):
- prefill (producer): `generate` with `GenerateRequest.kv_send` computes the prompt, samples
  the first token, then the connector ships the prompt's KV to the decode instance before the
  final output is emitted; the blocks are held until the send ends and freed after it (or on
  abort/failure). The final output's `kv_transfer` says what moved; a failed send raises
  KVTransferFailedError from the stream.
- decode (consumer): `reserve_kv` allocates blocks for a prompt whose KV arrives from
  elsewhere (reusing the decode side's own prefix-cache hits, which need not be sent) and arms
  the connector to accept exactly those blocks with the reservation's token; `wait_kv`
  completes when they arrived (raises KVTransferFailedError after a failed transfer, after
  which the connector is armed again for a retry); `generate_reserved` starts decoding from
  the prefill's first token; `release_kv` frees a reservation that will not be decoded.
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from shared.engine.outputs import RequestOutput
from shared.executor.base import SampledLogprobs
from shared.sampling.params import SamplingParams


@dataclass(frozen=True)
class KVSendParams:
    """Producer side: where this request's prompt KV goes once computed."""
    remote_address: str                 # the consumer connector's address ("host:port")
    remote_block_ids: tuple[int, ...]   # one per prompt block, in prompt order
    num_skip_blocks: int                # leading blocks the consumer already holds (not sent)
    transfer_token: bytes               # the consumer's per-reservation secret


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    cache_salt: str | None = None
    # Migration: the prompt's last tokens are outputs generated elsewhere already.
    num_resumed_output_tokens: int = 0
    kv_send: KVSendParams | None = None


@dataclass(frozen=True)
class KVReservation:
    """Consumer side: the blocks reserved for a prompt whose KV a producer will send."""
    request_id: str
    block_ids: tuple[int, ...]          # the whole prompt's block table
    num_cached_tokens: int              # prompt tokens the consumer already holds
    num_skip_blocks: int                # = blocks already held: the producer skips these
    transfer_address: str               # where the producer connects
    transfer_token: bytes


@dataclass(frozen=True)
class KVTransferResult:
    num_bytes: int
    seconds: float


@dataclass(frozen=True)
class EngineLoad:
    num_waiting: int
    num_running: int
    num_reserved: int
    num_free_blocks: int
    num_total_blocks: int


@dataclass(frozen=True)
class EngineStatus:
    """Counters and load, taken in one consistent snapshot between steps."""
    load: EngineLoad
    num_held: int
    num_prompt_tokens_computed: int
    num_cached_prompt_tokens: int
    num_generation_tokens: int
    num_requests_finished: int
    kv_bytes_transferred: int = 0
    kv_transfer_seconds: float = 0.0


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


@dataclass(frozen=True)
class KVCacheEvents:
    """Prefix-cache changes since the previous drain (the prefix publisher's input); with
    `is_snapshot`, `stored` is every cached hash and the consumer replaces what it had."""
    stored: tuple[bytes, ...] = ()
    removed: tuple[bytes, ...] = ()
    is_snapshot: bool = False


@dataclass(frozen=True)
class EngineMemory:
    """Bounded caches and per-request state inside the engine, for the memory metrics."""
    caches: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # name -> (entries, limit, bytes)


class EngineDeadError(RuntimeError):
    """The engine (thread or core process) failed; every request in flight gets this."""


class RequestFailedError(RuntimeError):
    """Computing this one request failed (finish reason "error"); the engine carries on."""


class CapacityError(RuntimeError):
    """The engine has no room for the request now (blocks or sequence slots)."""


class KVTransferFailedError(RuntimeError):
    """A KV transfer for this request failed (the request may be retried elsewhere)."""


class EngineClient(Protocol):
    info: EngineInfo

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    @property
    def is_alive(self) -> bool: ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """Validate (InvalidRequestError), prepare (grammar compile, off the step loop), queue,
        and stream outputs until the request finishes; closing the stream early aborts it."""

    async def abort(self, request_id: str) -> None: ...

    async def reserve_kv(self, request: GenerateRequest) -> KVReservation: ...
    async def wait_kv(self, request_id: str) -> None: ...
    def generate_reserved(self, request_id: str, first_token_id: int,
                          first_logprobs: SampledLogprobs | None) -> AsyncIterator[RequestOutput]: ...
    async def release_kv(self, request_id: str) -> bool: ...

    def load(self) -> EngineLoad:
        """Latest snapshot, without a round trip (heartbeats, routing, drain)."""

    async def status(self) -> EngineStatus: ...
    async def kv_events(self, snapshot: bool = False) -> KVCacheEvents: ...
    async def memory(self) -> EngineMemory: ...
