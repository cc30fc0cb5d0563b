from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KVDtype(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_DTYPE_UNSPECIFIED: _ClassVar[KVDtype]
    KV_DTYPE_FLOAT32: _ClassVar[KVDtype]
    KV_DTYPE_FLOAT16: _ClassVar[KVDtype]
    KV_DTYPE_BFLOAT16: _ClassVar[KVDtype]

class KVTransferStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_TRANSFER_STATUS_UNSPECIFIED: _ClassVar[KVTransferStatus]
    KV_TRANSFER_STATUS_COMPLETED: _ClassVar[KVTransferStatus]
    KV_TRANSFER_STATUS_REJECTED: _ClassVar[KVTransferStatus]
KV_DTYPE_UNSPECIFIED: KVDtype
KV_DTYPE_FLOAT32: KVDtype
KV_DTYPE_FLOAT16: KVDtype
KV_DTYPE_BFLOAT16: KVDtype
KV_TRANSFER_STATUS_UNSPECIFIED: KVTransferStatus
KV_TRANSFER_STATUS_COMPLETED: KVTransferStatus
KV_TRANSFER_STATUS_REJECTED: KVTransferStatus

class KVTransferHeader(_message.Message):
    __slots__ = ("format_version", "request_id", "num_layers", "block_size", "num_kv_heads", "head_dim", "dtype", "num_blocks", "dst_block_ids", "payload_bytes", "rows_per_chunk", "has_chunk_crc32", "transfer_token", "adapter_key")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_CHUNK_FIELD_NUMBER: _ClassVar[int]
    HAS_CHUNK_CRC32_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_KEY_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    request_id: str
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: KVDtype
    num_blocks: int
    dst_block_ids: _containers.RepeatedScalarFieldContainer[int]
    payload_bytes: int
    rows_per_chunk: int
    has_chunk_crc32: bool
    transfer_token: bytes
    adapter_key: str
    def __init__(self, format_version: _Optional[int] = ..., request_id: _Optional[str] = ..., num_layers: _Optional[int] = ..., block_size: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., dtype: _Optional[_Union[KVDtype, str]] = ..., num_blocks: _Optional[int] = ..., dst_block_ids: _Optional[_Iterable[int]] = ..., payload_bytes: _Optional[int] = ..., rows_per_chunk: _Optional[int] = ..., has_chunk_crc32: _Optional[bool] = ..., transfer_token: _Optional[bytes] = ..., adapter_key: _Optional[str] = ...) -> None: ...

class KVTransferAck(_message.Message):
    __slots__ = ("request_id", "status", "field", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    status: KVTransferStatus
    field: str
    message: str
    def __init__(self, request_id: _Optional[str] = ..., status: _Optional[_Union[KVTransferStatus, str]] = ..., field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
