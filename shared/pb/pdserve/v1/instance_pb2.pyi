from shared.pb.pdserve.v1 import generation_pb2 as _generation_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadLoRAAdapterRequest(_message.Message):
    __slots__ = ("lora_name", "lora_path")
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    LORA_PATH_FIELD_NUMBER: _ClassVar[int]
    lora_name: str
    lora_path: str
    def __init__(self, lora_name: _Optional[str] = ..., lora_path: _Optional[str] = ...) -> None: ...

class UnloadLoRAAdapterRequest(_message.Message):
    __slots__ = ("lora_name",)
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    lora_name: str
    def __init__(self, lora_name: _Optional[str] = ...) -> None: ...

class UnloadLoRAAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PeerSource(_message.Message):
    __slots__ = ("instance_id", "grpc_address", "num_blocks", "num_local_blocks")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_LOCAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    grpc_address: str
    num_blocks: int
    num_local_blocks: int
    def __init__(self, instance_id: _Optional[str] = ..., grpc_address: _Optional[str] = ..., num_blocks: _Optional[int] = ..., num_local_blocks: _Optional[int] = ...) -> None: ...

class SendCachedBlocksRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "cache_salt", "num_skip_blocks", "ucx_address", "dst_block_ids", "transfer_token")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    NUM_SKIP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    UCX_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    cache_salt: str
    num_skip_blocks: int
    ucx_address: str
    dst_block_ids: _containers.RepeatedScalarFieldContainer[int]
    transfer_token: bytes
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., cache_salt: _Optional[str] = ..., num_skip_blocks: _Optional[int] = ..., ucx_address: _Optional[str] = ..., dst_block_ids: _Optional[_Iterable[int]] = ..., transfer_token: _Optional[bytes] = ...) -> None: ...

class SendCachedBlocksResponse(_message.Message):
    __slots__ = ("num_blocks",)
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    num_blocks: int
    def __init__(self, num_blocks: _Optional[int] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "cache_salt", "decode_ucx_address", "dst_block_ids", "num_skip_blocks", "transfer_token", "num_resumed_output_tokens", "peer_source", "lora_adapter")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    DECODE_UCX_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_SKIP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NUM_RESUMED_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PEER_SOURCE_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _generation_pb2.SamplingParams
    cache_salt: str
    decode_ucx_address: str
    dst_block_ids: _containers.RepeatedScalarFieldContainer[int]
    num_skip_blocks: int
    transfer_token: bytes
    num_resumed_output_tokens: int
    peer_source: PeerSource
    lora_adapter: LoRAAdapterRef
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_generation_pb2.SamplingParams, _Mapping]] = ..., cache_salt: _Optional[str] = ..., decode_ucx_address: _Optional[str] = ..., dst_block_ids: _Optional[_Iterable[int]] = ..., num_skip_blocks: _Optional[int] = ..., transfer_token: _Optional[bytes] = ..., num_resumed_output_tokens: _Optional[int] = ..., peer_source: _Optional[_Union[PeerSource, _Mapping]] = ..., lora_adapter: _Optional[_Union[LoRAAdapterRef, _Mapping]] = ...) -> None: ...

class LoRAAdapterRef(_message.Message):
    __slots__ = ("name", "key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    key: str
    def __init__(self, name: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("first_token_id", "first_logprobs", "prompt_logprobs", "num_computed_prompt_tokens", "num_cached_prompt_tokens", "kv_bytes_sent", "kv_transfer_seconds", "finish_reason", "stop_string", "stop_token_id", "final_text", "num_peer_prompt_tokens")
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FINAL_TEXT_FIELD_NUMBER: _ClassVar[int]
    NUM_PEER_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    first_token_id: int
    first_logprobs: _generation_pb2.PositionLogprobs
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_generation_pb2.PositionLogprobs]
    num_computed_prompt_tokens: int
    num_cached_prompt_tokens: int
    kv_bytes_sent: int
    kv_transfer_seconds: float
    finish_reason: _generation_pb2.FinishReason
    stop_string: str
    stop_token_id: int
    final_text: str
    num_peer_prompt_tokens: int
    def __init__(self, first_token_id: _Optional[int] = ..., first_logprobs: _Optional[_Union[_generation_pb2.PositionLogprobs, _Mapping]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_generation_pb2.PositionLogprobs, _Mapping]]] = ..., num_computed_prompt_tokens: _Optional[int] = ..., num_cached_prompt_tokens: _Optional[int] = ..., kv_bytes_sent: _Optional[int] = ..., kv_transfer_seconds: _Optional[float] = ..., finish_reason: _Optional[_Union[_generation_pb2.FinishReason, str]] = ..., stop_string: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., final_text: _Optional[str] = ..., num_peer_prompt_tokens: _Optional[int] = ...) -> None: ...

class FirstToken(_message.Message):
    __slots__ = ("token_id", "logprobs", "text", "prompt_logprobs")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprobs: _generation_pb2.PositionLogprobs
    text: str
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_generation_pb2.PositionLogprobs]
    def __init__(self, token_id: _Optional[int] = ..., logprobs: _Optional[_Union[_generation_pb2.PositionLogprobs, _Mapping]] = ..., text: _Optional[str] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_generation_pb2.PositionLogprobs, _Mapping]]] = ...) -> None: ...

class PrefillEvent(_message.Message):
    __slots__ = ("first_token", "done")
    FIRST_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    first_token: FirstToken
    done: PrefillResponse
    def __init__(self, first_token: _Optional[_Union[FirstToken, _Mapping]] = ..., done: _Optional[_Union[PrefillResponse, _Mapping]] = ...) -> None: ...

class LocalPrefillRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "cache_salt", "lease_ms", "num_resumed_output_tokens", "lora_adapter")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    NUM_RESUMED_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _generation_pb2.SamplingParams
    cache_salt: str
    lease_ms: int
    num_resumed_output_tokens: int
    lora_adapter: LoRAAdapterRef
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_generation_pb2.SamplingParams, _Mapping]] = ..., cache_salt: _Optional[str] = ..., lease_ms: _Optional[int] = ..., num_resumed_output_tokens: _Optional[int] = ..., lora_adapter: _Optional[_Union[LoRAAdapterRef, _Mapping]] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("ucx_address", "block_ids", "num_cached_prompt_tokens", "transfer_token", "num_skip_blocks")
    UCX_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NUM_SKIP_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ucx_address: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    num_cached_prompt_tokens: int
    transfer_token: bytes
    num_skip_blocks: int
    def __init__(self, ucx_address: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ..., num_cached_prompt_tokens: _Optional[int] = ..., transfer_token: _Optional[bytes] = ..., num_skip_blocks: _Optional[int] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("request_id", "first_token_id", "first_logprobs")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    first_token_id: int
    first_logprobs: _generation_pb2.PositionLogprobs
    def __init__(self, request_id: _Optional[str] = ..., first_token_id: _Optional[int] = ..., first_logprobs: _Optional[_Union[_generation_pb2.PositionLogprobs, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("request_id", "lease_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    lease_ms: int
    def __init__(self, request_id: _Optional[str] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("renewed",)
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    renewed: bool
    def __init__(self, renewed: _Optional[bool] = ...) -> None: ...

class InstanceGenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "cache_salt", "lora_adapter")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _generation_pb2.SamplingParams
    cache_salt: str
    lora_adapter: LoRAAdapterRef
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_generation_pb2.SamplingParams, _Mapping]] = ..., cache_salt: _Optional[str] = ..., lora_adapter: _Optional[_Union[LoRAAdapterRef, _Mapping]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InstanceStatus(_message.Message):
    __slots__ = ("instance_id", "role", "num_waiting", "num_running", "num_reserved", "num_free_blocks", "num_total_blocks", "num_prompt_tokens_computed", "num_cached_prompt_tokens", "num_generation_tokens", "num_requests_finished", "num_lease_expiries", "kv_bytes_transferred", "kv_transfer_seconds", "num_held", "num_local_prefills", "num_local_prefills_refused")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_RESERVED_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_COMPUTED_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_GENERATION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    NUM_LEASE_EXPIRIES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_TRANSFERRED_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NUM_HELD_FIELD_NUMBER: _ClassVar[int]
    NUM_LOCAL_PREFILLS_FIELD_NUMBER: _ClassVar[int]
    NUM_LOCAL_PREFILLS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    role: str
    num_waiting: int
    num_running: int
    num_reserved: int
    num_free_blocks: int
    num_total_blocks: int
    num_prompt_tokens_computed: int
    num_cached_prompt_tokens: int
    num_generation_tokens: int
    num_requests_finished: int
    num_lease_expiries: int
    kv_bytes_transferred: int
    kv_transfer_seconds: float
    num_held: int
    num_local_prefills: int
    num_local_prefills_refused: int
    def __init__(self, instance_id: _Optional[str] = ..., role: _Optional[str] = ..., num_waiting: _Optional[int] = ..., num_running: _Optional[int] = ..., num_reserved: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_total_blocks: _Optional[int] = ..., num_prompt_tokens_computed: _Optional[int] = ..., num_cached_prompt_tokens: _Optional[int] = ..., num_generation_tokens: _Optional[int] = ..., num_requests_finished: _Optional[int] = ..., num_lease_expiries: _Optional[int] = ..., kv_bytes_transferred: _Optional[int] = ..., kv_transfer_seconds: _Optional[float] = ..., num_held: _Optional[int] = ..., num_local_prefills: _Optional[int] = ..., num_local_prefills_refused: _Optional[int] = ...) -> None: ...
