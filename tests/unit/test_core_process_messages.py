"""The engine-core protocol: every message survives the codec unchanged; another protocol
version, or bytes that are not a message, are refused with ProtocolError."""

import msgspec
import pytest

from shared.config import CacheConfig, EngineConfig
from shared.engine.core_outputs import EngineCoreOutput
from shared.engine.core_process.messages import (PROTOCOL_VERSION, AbortRequests, AddRequest, CallResult,
                                                 CoreFailed, CoreStartup, FinishRequests, PrefillReserved,
                                                 ProtocolError, Query, Ready, Rejected, ReleaseKV, RenewKV, ReserveKV,
                                                 Shutdown, StartReserved, StepOutputs, check_version, decode_core_message,
                                                 decode_service_message, decode_startup, encode)
from shared.engine_api.client import (CacheSettings, EngineInfo, EngineLoad, EngineMemory, EngineStatus, KVCacheEvents,
                                      KVReservation, ReservationEvent, ReservationEventKind)
from shared.engine_api.outputs import SampledLogprobs
from shared.guided.params import GuidedDecodingParams
from shared.kv_transfer.types import (KVConnectorRole, KVConnectorStats, KVSendParams, KVTransferConfig,
                                      KVTransferResult)
from shared.lora import LoRAConfig, LoRARequest
from shared.memory.idle_trim import TrimPolicy
from shared.sampling.params import SamplingParams

LOAD = EngineLoad(num_waiting=1, num_running=2, num_reserved=0, num_free_blocks=7, num_total_blocks=64)
INFO = EngineInfo(CacheSettings("tiny", 4, "sha256", "float32", "layers=2,kv_heads=2,head_dim=16"), num_blocks=64,
                  vocab_size=256, max_model_len=128, weight_bytes=1000, kv_pool_bytes=2000,
                  kv_transfer_address="127.0.0.1:4000")
STATUS = EngineStatus(LOAD, num_held=1, num_prompt_tokens=30, num_prompt_tokens_computed=10,
                      num_cached_prompt_tokens=4, num_generation_tokens=20, num_requests_finished=3,
                      num_prefix_cache_queries=5, num_prefix_cache_hits=2, num_preemptions=0, num_steps=40,
                      kv_transfer=KVConnectorStats(), memory=EngineMemory({"request_state": (3, -1, -1)}))
SEND = KVSendParams("127.0.0.1:4000", "r1", (7, 8, 9), 1, b"\x05" * 16)
SERVICE_MESSAGES = [
    AddRequest("r1", [5, 6, 7], SamplingParams(n=2, temperature=0.5, seed=3, stop=["x"], logprobs=2,
                                                 guided=GuidedDecodingParams(regex="[0-9]+")),
               cache_salt="tenant", num_resumed_output_tokens=1, kv_send=SEND),
    ReserveKV(3, "r4", [1, 2, 3], SamplingParams(max_tokens=4), "tenant", 0),
    # A traced request carries its caller's W3C trace context (shared.tracing).
    ReserveKV(5, "r6", [1, 2], SamplingParams(max_tokens=2), None, 0,
              {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}),
    AddRequest("r7", [4], SamplingParams(), trace_context={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-"
                                                                           "00f067aa0ba902b7-01", "tracestate": "a=1"}),
    AddRequest("r8", [5, 6], SamplingParams(), lora_request=LoRARequest("sql", 2, "/adapters/sql")),
    ReserveKV(9, "r9", [1, 2, 3], SamplingParams(max_tokens=4), lora_request=LoRARequest("sql", 2, "/adapters/sql")),
    ReserveKV(10, "r10", [1, 2, 3], SamplingParams(max_tokens=4), lease_s=2.5),
    RenewKV(11, "r10", 2.5),
    StartReserved("r4", 17, SampledLogprobs(-0.25, [(17, -0.25)])),
    PrefillReserved("r5"),
    ReleaseKV(4, "r4"),
    AbortRequests(["r1", "r2"]),
    FinishRequests(["r1#0"], "stop"),
    FinishRequests(["r2"], "error", "detokenizer failed"),
    Query(7, "kv_snapshot"),
    Query(12, "kv_arrived", "r10"),
    Shutdown(),
]
CORE_MESSAGES = [
    Ready(PROTOCOL_VERSION, INFO, pid=1234),
    StepOutputs([EngineCoreOutput("r1#1", [9, 10], [SampledLogprobs(-0.5, [(9, -0.5), (3, -1.5)])] * 2,
                                  [SampledLogprobs(-2.0, [])], "length", None, 4, first_scheduled_time=12.5),
                 EngineCoreOutput("r2", finish_reason="error", error="sampling failed"),
                 EngineCoreOutput("p1", [4], finish_reason="length", kv_transfer=KVTransferResult(4096, 0.01))],
                LOAD, STATUS, [ReservationEvent("r4", ReservationEventKind.ARRIVED),
                               ReservationEvent("r5", ReservationEventKind.TRANSFER_FAILED, "CRC mismatch", 1),
                               ReservationEvent("r6", ReservationEventKind.EXPIRED, num_failed_transfers=2)]),
    Rejected("r3", "prompt_token_ids", "token id 999 is outside the vocabulary"),
    CallResult(7, status=STATUS),
    CallResult(8, kv_events=KVCacheEvents(stored=(b"\x01" * 32,), removed=(b"\x02" * 32,))),
    CallResult(3, reservation=KVReservation("r4", (1, 2), 16, 1, "127.0.0.1:4000", b"\x07" * 16)),
    CallResult(4, released=True, load=EngineLoad(0, 1, 0, 12, 32)),
    CallResult(11, renewed=False),
    CallResult(12, kv_arrived=True),
    CallResult(5, error_kind="capacity", error="no room for 300 prompt tokens"),
    CoreFailed("RuntimeError: forward pass failed"),
]


@pytest.mark.parametrize("message", SERVICE_MESSAGES, ids=lambda m: type(m).__name__)
def test_service_messages_round_trip(message):
    assert decode_service_message(encode(message)) == message


@pytest.mark.parametrize("message", CORE_MESSAGES, ids=lambda m: type(m).__name__)
def test_core_messages_round_trip(message):
    assert decode_core_message(encode(message)) == message


def test_startup_round_trips_the_engine_config():
    config = EngineConfig(model="/models/tiny", dtype="float32", num_threads=2,
                          cache=CacheConfig(block_size=4, num_blocks=64),
                          lora=LoRAConfig(enable_lora=True, max_loras=2, max_lora_rank=8),
                          kv_transfer=KVTransferConfig("shared.kv_transfer.ucx.connector:UCXConnector",
                                                       KVConnectorRole.CONSUMER, port=0))
    startup = CoreStartup(PROTOCOL_VERSION, config, "ipc:///tmp/x/requests", "ipc:///tmp/x/outputs",
                          TrimPolicy(idle_interval_s=10.0, busy_growth_bytes=0))
    assert decode_startup(encode(startup)) == startup


def test_another_protocol_version_is_refused_at_startup():
    startup = CoreStartup(PROTOCOL_VERSION + 1, EngineConfig(), "ipc://a", "ipc://b")
    with pytest.raises(ProtocolError, match=f"version {PROTOCOL_VERSION + 1}"):
        decode_startup(encode(startup))


def test_another_protocol_version_is_refused_in_ready():
    ready = decode_core_message(encode(Ready(PROTOCOL_VERSION + 1, INFO, pid=1)))
    with pytest.raises(ProtocolError, match="the engine core speaks engine-core protocol version"):
        check_version(ready.protocol_version, "the engine core")


def test_a_core_message_is_not_a_service_message():
    with pytest.raises(ProtocolError, match="not an engine-core message"):
        decode_service_message(encode(CoreFailed("x")))


def test_bytes_that_are_not_a_message_are_refused():
    with pytest.raises(ProtocolError):
        decode_core_message(b"\x93\x01\x02")
    with pytest.raises(ProtocolError):
        decode_service_message(msgspec.msgpack.encode({"type": "AddRequest", "request_id": 5}))
