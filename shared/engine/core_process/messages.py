"""The typed, versioned protocol between a service process and its engine-core process.

Every message is a tagged msgspec struct encoded as MessagePack: only the types below decode,
nothing is pickled. The service starts the core with a `CoreStartup` on its stdin; the core
answers on its output socket with `Ready` (protocol version and the engine's info) before
anything else. Either side refuses a peer whose `PROTOCOL_VERSION` differs.

Schema rules: bump PROTOCOL_VERSION whenever a message changes shape (both ends ship in the
same package, so a mismatch means a stale interpreter or a mixed install, and is refused at
the handshake rather than misread later).
"""

from typing import Literal

import msgspec

from shared.config import EngineConfig
from shared.engine.core_outputs import EngineCoreOutput
from shared.engine_api.client import (CachedSend, EngineInfo, EngineLoad, EngineMemory, EngineStatus, KVCacheEvents,
                                      KVReservation, ReservationEvent)
from shared.engine_api.outputs import SampledLogprobs
from shared.kv_transfer.types import KVSendParams
from shared.lora.request import LoRARequest
from shared.memory.idle_trim import TrimPolicy
from shared.sampling.params import SamplingParams

PROTOCOL_VERSION = 7


class ProtocolError(RuntimeError):
    """A peer speaks another protocol version, or sent something that is not a message."""


# ---- startup (stdin of the child) ----------------------------------------------------------

class CoreStartup(msgspec.Struct, frozen=True):
    protocol_version: int
    config: EngineConfig
    input_address: str     # the core receives requests here (the service binds it)
    output_address: str    # the core sends outputs here (the service binds it)
    trim_policy: TrimPolicy = TrimPolicy()  # when the core returns free heap memory to the OS


# ---- service -> core -------------------------------------------------------------------------

class AddRequest(msgspec.Struct, tag=True, frozen=True):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None = None
    num_resumed_output_tokens: int = 0
    # Prefill role: where the KV connector ships the prompt's KV once computed.
    kv_send: KVSendParams | None = None
    # The caller's trace context (W3C traceparent/tracestate) while tracing is on.
    trace_context: dict[str, str] | None = None
    # The LoRA adapter it runs with (None: the base model).
    lora_request: LoRARequest | None = None


class ReserveKV(msgspec.Struct, tag=True, frozen=True):
    """Decode role: allocate blocks for a prompt whose KV arrives through the connector, held
    until `lease_s` from now unless renewed (None: until released); answered by a CallResult
    with the reservation, or why not."""
    call_id: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None = None
    num_resumed_output_tokens: int = 0
    trace_context: dict[str, str] | None = None
    lora_request: LoRARequest | None = None
    lease_s: float | None = None


class RenewKV(msgspec.Struct, tag=True, frozen=True):
    """Move a reservation's deadline to `lease_s` from now; CallResult.renewed says if it was live."""
    call_id: int
    request_id: str
    lease_s: float


class StartReserved(msgspec.Struct, tag=True, frozen=True):
    """Decode role: the reservation's KV arrived; decode from the producer's first token."""
    request_id: str
    first_token_id: int
    first_logprobs: SampledLogprobs | None = None


class PrefillReserved(msgspec.Struct, tag=True, frozen=True):
    """Decode role: compute the reservation's prompt here instead of receiving its KV."""
    request_id: str


class ReleaseKV(msgspec.Struct, tag=True, frozen=True):
    """Free a reservation that will not be decoded; CallResult.released says if there was one.
    With `keep_arrived` (a peer pull), KV that arrived joins the prefix cache first."""
    call_id: int
    request_id: str
    keep_arrived: bool = False


class SendCached(msgspec.Struct, tag=True, frozen=True):
    """Holder of a peer pull: send the prefix's blocks; CallResult.num_blocks says how many."""
    call_id: int
    send: CachedSend


class AbortRequests(msgspec.Struct, tag=True, frozen=True):
    request_ids: list[str]


class FinishRequests(msgspec.Struct, tag=True, frozen=True):
    """The output processor ended these engine requests (a stop string, or a failed text
    pipeline): the core finishes them with that reason."""
    child_ids: list[str]
    reason: Literal["stop", "error"]
    error: str | None = None


class Query(msgspec.Struct, tag=True, frozen=True):
    """A read of the engine's state between steps, answered by `CallResult` with `call_id`;
    "kv_arrived" asks whether the KV of the reservation `request_id` has arrived."""
    call_id: int
    what: Literal["status", "kv_events", "kv_snapshot", "memory", "kv_arrived"]
    request_id: str = ""


class Shutdown(msgspec.Struct, tag=True, frozen=True):
    pass


ServiceMessage = (AddRequest | ReserveKV | RenewKV | StartReserved | PrefillReserved | ReleaseKV | SendCached
                  | AbortRequests | FinishRequests | Query | Shutdown)


# ---- core -> service -------------------------------------------------------------------------

class Ready(msgspec.Struct, tag=True, frozen=True):
    protocol_version: int
    info: EngineInfo
    pid: int


class StepOutputs(msgspec.Struct, tag=True, omit_defaults=True):
    outputs: list[EngineCoreOutput]
    load: EngineLoad
    # Every STATUS_INTERVAL_S or so while stepping, and whenever the core goes idle.
    status: EngineStatus | None = None
    # What happened to reservations since the last message (the scheduler's, in order).
    reservation_events: list[ReservationEvent] = []


class Rejected(msgspec.Struct, tag=True, frozen=True):
    """An AddRequest, StartReserved or PrefillReserved the core refused (InvalidRequestError
    naming `field`)."""
    request_id: str
    field: str
    message: str


class CallResult(msgspec.Struct, tag=True, frozen=True):
    """The answer to a Query, ReserveKV, RenewKV, ReleaseKV or SendCached with the same call_id. A refused call
    has `error_kind` "invalid" (InvalidRequestError naming `error_field`) or "capacity". `load` is the
    load once the call was handled."""
    call_id: int
    load: EngineLoad | None = None
    status: EngineStatus | None = None
    kv_events: KVCacheEvents | None = None
    memory: EngineMemory | None = None
    reservation: KVReservation | None = None
    released: bool | None = None
    renewed: bool | None = None
    kv_arrived: bool | None = None
    num_blocks: int | None = None
    error_kind: Literal["invalid", "capacity"] | None = None
    error_field: str = ""
    error: str | None = None


class CoreFailed(msgspec.Struct, tag=True, frozen=True):
    """The core's last word before it exits after a failure of the engine as a whole."""
    error: str


CoreMessage = Ready | StepOutputs | Rejected | CallResult | CoreFailed


_encoder = msgspec.msgpack.Encoder()
_service_decoder = msgspec.msgpack.Decoder(ServiceMessage)
_core_decoder = msgspec.msgpack.Decoder(CoreMessage)
_startup_decoder = msgspec.msgpack.Decoder(CoreStartup)


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode_service_message(data: bytes) -> ServiceMessage:
    return _decode(_service_decoder, data)


def decode_core_message(data: bytes) -> CoreMessage:
    return _decode(_core_decoder, data)


def decode_startup(data: bytes) -> CoreStartup:
    """The child's first read; refuses another protocol version."""
    startup = _decode(_startup_decoder, data)
    check_version(startup.protocol_version, "the service process")
    return startup


def check_version(version: int, peer: str) -> None:
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"{peer} speaks engine-core protocol version {version}, "
                            f"this side speaks {PROTOCOL_VERSION}")


def _decode(decoder: msgspec.msgpack.Decoder, data: bytes):
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise ProtocolError(f"not an engine-core message: {error}") from error
