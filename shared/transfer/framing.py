"""Length-prefixed protobuf messages over a ucxx endpoint (headers and acks; never payloads).

A frame is two ucxx tag messages on the endpoint: the body length as 8 little-endian bytes,
then the serialized body (skipped when empty). Called by KVSender and KVReceiver.
"""

import numpy as np
from google.protobuf.message import DecodeError, Message

from shared.transfer.errors import KVTransferError

MAX_FRAME_BYTES = 4 << 20
_LENGTH_DTYPE = np.dtype("<u8")


async def send_message(endpoint, message: Message) -> None:
    """Send one protobuf message as a frame."""
    body = bytearray(message.SerializeToString())
    length = np.array([len(body)], dtype=_LENGTH_DTYPE)
    await endpoint.send(length.view(np.uint8))
    if body:
        await endpoint.send(body)


async def recv_message(endpoint, message_type: type[Message], max_bytes: int = MAX_FRAME_BYTES) -> Message:
    """Receive one frame and parse it as `message_type`; oversized or garbled frames raise KVTransferError."""
    length = np.zeros(1, dtype=_LENGTH_DTYPE)
    await endpoint.recv(length.view(np.uint8))
    num_bytes = int(length[0])
    if num_bytes > max_bytes:
        raise KVTransferError("frame", f"{num_bytes} bytes exceeds the {max_bytes}-byte limit")
    body = bytearray(num_bytes)
    if num_bytes:
        await endpoint.recv(body)
    message = message_type()
    try:
        message.ParseFromString(bytes(body))
    except DecodeError as error:
        raise KVTransferError("frame", f"not a {message_type.__name__}: {error}") from error
    return message
