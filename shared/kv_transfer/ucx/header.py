"""The KV transfer header: building it, checking it against the receiver's cache.

The sender (shared.kv_transfer.ucx.sender) calls `check_kv_cache` and `build_header`; the
receiver (shared.kv_transfer.ucx.receiver) calls `validate_header` on every header it gets.
The payload's layout and its chunks are in shared.kv_transfer.ucx.chunks.

Payload = the source blocks gathered as one C-contiguous tensor of shape
(2, num_layers, num_blocks, block_size, num_kv_heads, head_dim) in the cache's own dtype,
sent as raw bytes in chunks of `rows_per_chunk` rows. Block i lands in dst_block_ids[i].
"""

from collections.abc import Sequence

import numpy as np
import torch

from shared.errors import ConfigurationError, InternalError
from shared.kv_cache.layout import KVCacheLayout
from shared.kv_transfer.ucx.chunks import num_rows
from shared.kv_transfer.ucx.protocol import FORMAT_VERSION, KVTransferError
from shared.pb.pdserve.v1 import kv_transfer_pb2 as pb

_WIRE_DTYPES = {
    torch.float32: pb.KV_DTYPE_FLOAT32,
    torch.float16: pb.KV_DTYPE_FLOAT16,
    torch.bfloat16: pb.KV_DTYPE_BFLOAT16,
}
_LAYOUT_FIELDS = ("num_layers", "block_size", "num_kv_heads", "head_dim")


def dtype_to_wire(dtype: torch.dtype) -> int:
    """The KVDtype enum value for a torch dtype; unsupported dtypes are invalid input."""
    if dtype not in _WIRE_DTYPES:
        supported = ", ".join(str(d).removeprefix("torch.") for d in _WIRE_DTYPES)
        raise ConfigurationError("dtype", f"{dtype} cannot be transferred (supported: {supported})")
    return _WIRE_DTYPES[dtype]


def wire_dtype_name(wire_dtype: int) -> str:
    """"bfloat16" for KV_DTYPE_BFLOAT16; the raw number for values this build does not know."""
    if wire_dtype not in pb.KVDtype.values():
        return f"unknown({wire_dtype})"
    return pb.KVDtype.Name(wire_dtype).removeprefix("KV_DTYPE_").lower()


def payload_num_bytes(layout: KVCacheLayout, num_blocks: int) -> int:
    """Exact payload size for `num_blocks` blocks of `layout`."""
    return layout.bytes_per_block * num_blocks


def find_block_id_problem(block_ids: Sequence[int], num_blocks: int) -> str | None:
    """Why `block_ids` cannot address a cache of `num_blocks` blocks, or None if they can.

    Empty lists, ids outside [0, num_blocks) and duplicates are problems (a duplicate
    destination would make the write order-dependent).
    """
    if len(block_ids) == 0:
        return "must list at least one block id"
    for block_id in block_ids:
        if not 0 <= block_id < num_blocks:
            return f"block id {block_id} out of range [0, {num_blocks})"
    if len(set(block_ids)) != len(block_ids):
        return "block ids must be unique"
    return None


def check_kv_cache(kv_cache: torch.Tensor, layout: KVCacheLayout) -> None:
    """Raise InternalError unless `kv_cache` is `layout`'s contiguous tensor."""
    if tuple(kv_cache.shape) != layout.shape or kv_cache.dtype != layout.dtype:
        raise InternalError(f"kv_cache: shape {tuple(kv_cache.shape)} {kv_cache.dtype} does not match layout "
                            f"{layout.shape} {layout.dtype}")
    if not kv_cache.is_contiguous():
        raise InternalError("kv_cache: must be contiguous")
    if kv_cache.device.type not in ("cpu", "cuda"):
        raise InternalError(f"kv_cache: must be on the CPU or a CUDA GPU, got {kv_cache.device}")


def build_header(
    request_id: str, layout: KVCacheLayout, dst_block_ids: Sequence[int], rows_per_chunk: int, has_chunk_crc32: bool,
    transfer_token: bytes = b"", adapter_key: str = "",
) -> pb.KVTransferHeader:
    """The header the sender puts in front of a payload of len(dst_block_ids) blocks;
    `adapter_key`: the LoRA adapter the KV was computed with ("" for the base model)."""
    header = pb.KVTransferHeader(
        format_version=FORMAT_VERSION,
        request_id=request_id,
        num_layers=layout.num_layers,
        block_size=layout.block_size,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        dtype=dtype_to_wire(layout.dtype),
        num_blocks=len(dst_block_ids),
        dst_block_ids=list(dst_block_ids),
        payload_bytes=payload_num_bytes(layout, len(dst_block_ids)),
        rows_per_chunk=rows_per_chunk,
        has_chunk_crc32=has_chunk_crc32,
    )
    if transfer_token:
        header.transfer_token = transfer_token
    if adapter_key:
        header.adapter_key = adapter_key
    return header


def adapter_mismatch(sender_key: str, receiver_key: str) -> str | None:
    """Why KV computed with adapter `sender_key` cannot serve a reservation for `receiver_key`
    ("" is the base model), or None when they agree."""
    if sender_key == receiver_key:
        return None
    return f"sender computed with {sender_key or 'the base model'!s}, the reservation is for " \
           f"{receiver_key or 'the base model'!s}"


def validate_header(header: pb.KVTransferHeader, layout: KVCacheLayout) -> None:
    """Raise KVTransferError naming the first header field that does not fit the receiver's layout."""
    if header.format_version != FORMAT_VERSION:
        raise KVTransferError(
            "format_version", f"sender {header.format_version}, receiver {FORMAT_VERSION}"
        )
    if not header.request_id:
        raise KVTransferError("request_id", "must not be empty")
    for field in _LAYOUT_FIELDS:
        sender_value, receiver_value = getattr(header, field), getattr(layout, field)
        if sender_value != receiver_value:
            raise KVTransferError(field, f"sender {sender_value}, receiver {receiver_value}")
    if header.dtype != _WIRE_DTYPES.get(layout.dtype):
        raise KVTransferError(
            "dtype",
            f"sender {wire_dtype_name(header.dtype)}, receiver {str(layout.dtype).removeprefix('torch.')}",
        )
    _validate_block_list(header, layout)


def _validate_block_list(header: pb.KVTransferHeader, layout: KVCacheLayout) -> None:
    """The block count, ids, payload size and chunking of `header` must agree with each other and the cache."""
    if header.num_blocks != len(header.dst_block_ids):
        raise KVTransferError(
            "num_blocks", f"header says {header.num_blocks} but lists {len(header.dst_block_ids)} dst_block_ids"
        )
    problem = find_block_id_problem(header.dst_block_ids, layout.num_blocks)
    if problem is not None:
        raise KVTransferError("dst_block_ids", problem)
    expected_bytes = payload_num_bytes(layout, header.num_blocks)
    if header.payload_bytes != expected_bytes:
        raise KVTransferError(
            "payload_bytes",
            f"sender {header.payload_bytes}, receiver expects {expected_bytes} for {header.num_blocks} blocks",
        )
    if not 1 <= header.rows_per_chunk <= num_rows(layout):
        raise KVTransferError("rows_per_chunk", f"must be 1 to {num_rows(layout)}, got {header.rows_per_chunk}")


def as_numpy_bytes(payload: torch.Tensor) -> np.ndarray:
    """A zero-copy numpy view of a 1-D uint8 CPU tensor, the form ucxx sends and receives."""
    return payload.numpy()
