"""Which string field of an undecodable protobuf message holds invalid UTF-8.

protobuf refuses a message whose string field is not valid UTF-8 with a DecodeError that
names no field. `invalid_utf8_field(descriptor, data)` walks the message's wire format
against its descriptor and returns the full path of the first such field
(`chat.messages[2].content`, `sampling.stop[0]`), or None when the bytes are broken some
other way. Iterative (a stack of nested messages), so a deeply nested message cannot
exhaust Python's stack.
"""

from google.protobuf.descriptor import Descriptor, FieldDescriptor

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
_FIXED_SIZES = {FIXED64: 8, FIXED32: 4}


class _Unreadable(Exception):
    """The wire format itself is broken (not only a string's UTF-8)."""


def invalid_utf8_field(descriptor: Descriptor, data: bytes) -> str | None:
    pending = [(descriptor, memoryview(data), "")]
    try:
        while pending:
            message, payload, path = pending.pop()
            for field, value, field_path in _length_delimited_fields(message, payload, path):
                if field.type == FieldDescriptor.TYPE_STRING and not _is_utf8(value):
                    return field_path
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    pending.append((field.message_type, value, field_path))
    except _Unreadable:
        return None
    return None


def _length_delimited_fields(message: Descriptor, payload: memoryview, path: str):
    """(field, its bytes, its path) for each known length-delimited field of `payload`."""
    occurrences: dict[int, int] = {}
    position = 0
    while position < len(payload):
        key, position = _varint(payload, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            _, position = _varint(payload, position)
        elif wire_type in _FIXED_SIZES:
            position += _FIXED_SIZES[wire_type]
        elif wire_type == LENGTH_DELIMITED:
            size, position = _varint(payload, position)
            value, position = payload[position:position + size], position + size
            field = message.fields_by_number.get(number)
            if field is not None:
                index = occurrences.get(number, 0)
                occurrences[number] = index + 1
                yield field, value, _field_path(path, field, index)
        else:
            raise _Unreadable(f"wire type {wire_type}")
        if position > len(payload):
            raise _Unreadable("truncated")


def _field_path(parent: str, field: FieldDescriptor, index: int) -> str:
    name = f"{parent}.{field.name}" if parent else field.name
    return f"{name}[{index}]" if field.is_repeated else name


def _varint(payload: memoryview, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if position >= len(payload) or shift > 63:
            raise _Unreadable("truncated varint")
        byte = payload[position]
        value |= (byte & 0x7F) << shift
        position, shift = position + 1, shift + 7
        if not byte & 0x80:
            return value, position


def _is_utf8(value: memoryview) -> bool:
    try:
        str(value, "utf-8")
    except UnicodeDecodeError:
        return False
    return True
