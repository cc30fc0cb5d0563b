"""A protobuf message whose string field is not valid UTF-8 is refused naming the field's full
path (services.rpc.utf8_fields): protobuf's own DecodeError names no field."""

import pytest
from google.protobuf.message import DecodeError

from services.rpc.utf8_fields import invalid_utf8_field
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import generation_pb2 as gen
from shared.pb.pdserve.v1 import instance_pb2 as pb

MARKER = "<<not-utf8>>"


def with_invalid_utf8(message) -> bytes:
    """`message`'s bytes with MARKER replaced by as many bytes that are not UTF-8 (same length,
    so the wire format stays whole)."""
    data = message.SerializeToString()
    assert data.count(MARKER.encode()) == 1
    return data.replace(MARKER.encode(), b"\xff" * len(MARKER))


def chat(*contents: str) -> gw.ChatMessages:
    return gw.ChatMessages(messages=[gw.ChatMessage(role="user", content=content) for content in contents])


@pytest.mark.parametrize("message, path", [
    (gw.GenerateRequest(text=MARKER), "text"),
    (gw.GenerateRequest(text="Hi", model=MARKER), "model"),
    (gw.GenerateRequest(text="Hi", request_id=MARKER), "request_id"),
    (gw.GenerateRequest(text="Hi", cache_salt=MARKER), "cache_salt"),
    (gw.GenerateRequest(chat=chat("a", "b", MARKER)), "chat.messages[2].content"),
    (gw.GenerateRequest(chat=gw.ChatMessages(messages=[gw.ChatMessage(role=MARKER, content="a")])),
     "chat.messages[0].role"),
    (gw.GenerateRequest(text="Hi", sampling=gen.SamplingParams(max_tokens=2, stop=["x", MARKER])), "sampling.stop[1]"),
    (gw.GenerateRequest(text="Hi", sampling=gen.SamplingParams(guided=gen.GuidedDecoding(regex=MARKER))),
     "sampling.guided.regex"),
    (gw.TokenizeRequest(text=MARKER), "text"),
    (gw.LoRAAdapterRequest(lora_name=MARKER), "lora_name"),
    (pb.ReserveRequest(request_id="r", prompt_token_ids=[1, 2], cache_salt=MARKER), "cache_salt"),
    (pb.DecodeRequest(request_id=MARKER, first_token_id=3), "request_id"),
])
def test_the_first_string_field_holding_invalid_utf8_is_named_by_its_full_path(message, path):
    data = with_invalid_utf8(message)
    with pytest.raises(DecodeError):
        type(message).FromString(data)
    assert invalid_utf8_field(message.DESCRIPTOR, data) == path


def test_valid_messages_and_broken_wire_formats_name_no_field():
    valid = gw.GenerateRequest(text="Hi", chat=chat("a"), sampling=gen.SamplingParams(stop=["x"]))
    assert invalid_utf8_field(gw.GenerateRequest.DESCRIPTOR, valid.SerializeToString()) is None
    for broken in (b"\xff\xff\xff", b"\x1a\x05ab", b"\x1b", b"\x1a"):
        assert invalid_utf8_field(gw.GenerateRequest.DESCRIPTOR, broken) is None
