"""The engine-core protocol: every message survives the codec unchanged; another protocol
version, or bytes that are not a message, are refused with ProtocolError."""

import msgspec
import pytest

from shared.config import CacheConfig, EngineConfig
from shared.engine.client import CacheSettings, EngineInfo, EngineLoad, EngineStatus, KVCacheEvents
from shared.engine.core_outputs import EngineCoreOutput
from shared.engine.core_process.messages import (PROTOCOL_VERSION, AbortRequests, AddRequest, CoreFailed,
                                                 CoreStartup, FinishRequests, ProtocolError, Query, QueryResult,
                                                 Ready, Rejected, Shutdown, StepOutputs, check_version,
                                                 decode_core_message, decode_service_message, decode_startup,
                                                 encode)
from shared.executor.base import SampledLogprobs
from shared.guided.params import GuidedDecodingParams
from shared.sampling.params import SamplingParams

LOAD = EngineLoad(num_waiting=1, num_running=2, num_reserved=0, num_free_blocks=7, num_total_blocks=64)
INFO = EngineInfo(CacheSettings("tiny", 4, "sha256", "float32", "kv,layer,block"), num_blocks=64,
                  vocab_size=256, max_model_len=128, weight_bytes=1000, kv_pool_bytes=2000)
SERVICE_MESSAGES = [
    AddRequest("r1", [5, 6, 7], SamplingParams(n=2, temperature=0.5, seed=3, stop=["x"], logprobs=2,
                                                 guided=GuidedDecodingParams(regex="[0-9]+")),
               cache_salt="tenant", num_resumed_output_tokens=1, hold_blocks_on_finish=True),
    AbortRequests(["r1", "r2"]),
    FinishRequests(["r1#0"], "stop"),
    FinishRequests(["r2"], "error", "detokenizer failed"),
    Query(7, "kv_snapshot"),
    Shutdown(),
]
CORE_MESSAGES = [
    Ready(PROTOCOL_VERSION, INFO, pid=1234),
    StepOutputs([EngineCoreOutput("r1#1", [9, 10], [SampledLogprobs(-0.5, [(9, -0.5), (3, -1.5)])] * 2,
                                  [SampledLogprobs(-2.0, [])], "length", None, 4),
                 EngineCoreOutput("r2", finish_reason="error", error="sampling failed")], LOAD),
    Rejected("r3", "prompt_token_ids", "token id 999 is outside the vocabulary"),
    QueryResult(7, status=EngineStatus(LOAD, 0, 10, 4, 20, 3)),
    QueryResult(8, kv_events=KVCacheEvents(stored=(b"\x01" * 32,), removed=(b"\x02" * 32,))),
    CoreFailed("RuntimeError: forward pass failed"),
]


@pytest.mark.parametrize("message", SERVICE_MESSAGES, ids=lambda m: type(m).__name__)
def test_service_messages_round_trip(message):
    assert decode_service_message(encode(message)) == message


@pytest.mark.parametrize("message", CORE_MESSAGES, ids=lambda m: type(m).__name__)
def test_core_messages_round_trip(message):
    assert decode_core_message(encode(message)) == message


def test_startup_round_trips_the_engine_config():
    config = EngineConfig(model="/models/tiny", dtype="float32", num_threads=2, cache=CacheConfig(block_size=4,
                                                                                                 num_blocks=64))
    startup = CoreStartup(PROTOCOL_VERSION, config, "ipc:///tmp/x/requests", "ipc:///tmp/x/outputs", 10.0)
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
