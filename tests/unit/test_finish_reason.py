"""finish_reason is one enum end to end: the engine's FinishReason, generation.proto's
FinishReason on the wire, and the OpenAI API's strings, each mapped in one place."""

import msgspec

from shared.core.request import RequestStatus
from shared.engine.core_outputs import EngineCoreOutput
from shared.engine_api.outputs import FinishReason
from shared.pb.pdserve.v1 import generation_pb2 as pb
from shared.wire.outputs import FINISH_REASONS, finish_reason_from_proto


def test_every_finished_status_has_its_reason_and_every_reason_that_travels_round_trips():
    finished = [s for s in RequestStatus if s.is_finished]
    assert {s.finish_reason for s in finished} == set(FinishReason)
    assert all(s.finish_reason is None for s in RequestStatus if not s.is_finished)
    for reason in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT):
        assert finish_reason_from_proto(FINISH_REASONS[reason]) is reason
    assert finish_reason_from_proto(pb.FINISH_REASON_UNSPECIFIED) is None
    assert FinishReason.ERROR not in FINISH_REASONS  # a failed request is an error status, not a reason


def test_the_reason_is_the_openai_string_and_survives_the_core_process_encoding():
    assert FinishReason.LENGTH == "length" and f"{FinishReason.STOP}" == "stop"
    output = EngineCoreOutput("r1", [7], finish_reason=FinishReason.ABORT)
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(output), type=EngineCoreOutput)
    assert decoded.finish_reason is FinishReason.ABORT
