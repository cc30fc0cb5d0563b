"""Protobuf messages over a ucxx endpoint, one ucxx message per protobuf (headers and acks).

A frame is a single ucxx tag message: the body length as 8 little-endian bytes, then the
serialized body. The receiving side posts a buffer of `max_bytes` + 8 bytes (UCX accepts a
shorter message into a longer buffer), so one frame costs one message and one wake-up.
Payloads travel on their own tag (PAYLOAD_TAG) and never through this module.
Called by KVSender and KVReceiver.
"""

import struct

from google.protobuf.message import DecodeError, Message

from shared.kv_transfer.ucx.env import ucxx
from shared.kv_transfer.ucx.protocol import KVTransferError

PAYLOAD_TAG = 1  # ucxx hashes it with the connection's own tag: payloads never match a frame receive
MAX_HEADER_BYTES = 1 << 20  # ~200k destination block ids
MAX_ACK_BYTES = 64 << 10
_LENGTH = struct.Struct("<Q")


async def send_message(endpoint, message: Message) -> None:
    """Send one protobuf message as one frame."""
    body = message.SerializeToString()
    frame = bytearray(_LENGTH.size + len(body))
    _LENGTH.pack_into(frame, 0, len(body))
    frame[_LENGTH.size:] = body
    await endpoint.send(frame)


async def recv_message(endpoint, message_type: type[Message], max_bytes: int) -> Message:
    """Receive one frame and parse it as `message_type`; oversized or garbled frames raise KVTransferError."""
    frame = bytearray(_LENGTH.size + max_bytes)
    try:
        await endpoint.recv(frame)
    except ucxx.exceptions.UCXMessageTruncatedError as error:
        raise KVTransferError("frame", f"exceeds the {max_bytes}-byte limit") from error
    (num_bytes,) = _LENGTH.unpack_from(frame)
    if num_bytes > max_bytes:
        raise KVTransferError("frame", f"says {num_bytes} bytes, over the {max_bytes}-byte limit")
    message = message_type()
    try:
        message.ParseFromString(bytes(frame[_LENGTH.size:_LENGTH.size + num_bytes]))
    except DecodeError as error:
        raise KVTransferError("frame", f"not a {message_type.__name__}: {error}") from error
    return message
