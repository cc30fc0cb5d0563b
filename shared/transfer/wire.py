"""The KV transfer wire format: header building/checking, payload packing and scattering.

The sender (shared.transfer.ucx_sender) calls `check_kv_cache`, `pack_blocks`, `payload_crc32`
and `build_header`; the receiver (shared.transfer.ucx_receiver) calls `validate_header` on
every header it gets, then `payload_crc32` and `scatter_payload` on the payload.

Payload = the source blocks gathered as one C-contiguous tensor of shape
(2, num_layers, num_blocks, block_size, num_kv_heads, head_dim) in the cache's own dtype,
sent as raw bytes (a 1-D uint8 tensor). Block i of the payload lands in dst_block_ids[i].
"""

import zlib
from collections.abc import Sequence

import numpy as np
import torch

from shared.errors import InvalidRequestError
from shared.kv_cache.layout import KVCacheLayout
from shared.pb.pdserve.v1 import kv_transfer_pb2 as pb
from shared.transfer.errors import KVTransferError

try:
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # optional speed-up; identical checksums
    _crc32 = zlib.crc32

FORMAT_VERSION = 1
_WIRE_DTYPES = {
    torch.float32: pb.KV_DTYPE_FLOAT32,
    torch.float16: pb.KV_DTYPE_FLOAT16,
    torch.bfloat16: pb.KV_DTYPE_BFLOAT16,
}
_LAYOUT_FIELDS = ("num_layers", "block_size", "num_kv_heads", "head_dim")
_SAME_SIZE_INTS = {2: torch.int16, 4: torch.int32}


def dtype_to_wire(dtype: torch.dtype) -> int:
    """The KVDtype enum value for a torch dtype; unsupported dtypes are invalid input."""
    if dtype not in _WIRE_DTYPES:
        supported = ", ".join(str(d).removeprefix("torch.") for d in _WIRE_DTYPES)
        raise InvalidRequestError("dtype", f"{dtype} cannot be transferred (supported: {supported})")
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
    """Raise InvalidRequestError("kv_cache", ...) unless `kv_cache` is `layout`'s contiguous tensor."""
    if tuple(kv_cache.shape) != layout.shape or kv_cache.dtype != layout.dtype:
        raise InvalidRequestError(
            "kv_cache",
            f"shape {tuple(kv_cache.shape)} {kv_cache.dtype} does not match layout "
            f"{layout.shape} {layout.dtype}",
        )
    if not kv_cache.is_contiguous():
        raise InvalidRequestError("kv_cache", "must be contiguous")
    if kv_cache.device.type != "cpu":
        raise InvalidRequestError("kv_cache", f"must be on the CPU, got {kv_cache.device}")


def build_header(
    request_id: str, layout: KVCacheLayout, dst_block_ids: Sequence[int], payload_crc32: int | None
) -> pb.KVTransferHeader:
    """The header the sender puts in front of a payload of len(dst_block_ids) blocks."""
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
    )
    if payload_crc32 is not None:
        header.payload_crc32 = payload_crc32
    return header


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
    """The block count, ids and payload size of `header` must agree with each other and the cache."""
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


def _block_slabs(tensor: torch.Tensor, layout: KVCacheLayout, num_blocks: int) -> np.ndarray:
    """A numpy view (2 * num_layers, num_blocks, elements per slab) of a cache or payload.

    Elements are viewed as same-size integers (numpy has no bfloat16); copying them moves the
    exact bits. numpy copies run on the calling thread, without torch's OpenMP pool, whose
    spinning workers would compete with UCX's progress threads for the cores.
    """
    same_size_int = _SAME_SIZE_INTS[layout.dtype.itemsize]
    return tensor.view(same_size_int).numpy().reshape(2 * layout.num_layers, num_blocks, -1)


def _check_payload(payload: torch.Tensor, layout: KVCacheLayout, num_blocks: int) -> torch.Tensor:
    """`payload` (1-D uint8, exact size) viewed in the cache dtype."""
    if payload.dtype != torch.uint8 or payload.dim() != 1:
        raise InvalidRequestError(
            "payload", f"must be a 1-D uint8 tensor, got {payload.dtype} {tuple(payload.shape)}"
        )
    expected_bytes = payload_num_bytes(layout, num_blocks)
    if payload.numel() != expected_bytes:
        raise InvalidRequestError("payload", f"{payload.numel()} bytes, expected {expected_bytes}")
    return payload.view(layout.dtype)


def pack_blocks(
    kv_cache: torch.Tensor, layout: KVCacheLayout, src_block_ids: Sequence[int], out: torch.Tensor | None = None
) -> torch.Tensor:
    """Gather `src_block_ids` of every layer into one payload (1-D uint8).

    `out`, if given, is a 1-D uint8 tensor of exactly the payload size that is filled in place
    (the sender reuses buffers this way; fresh allocations page-fault and are ~10x slower).
    """
    if out is None:
        out = torch.empty(payload_num_bytes(layout, len(src_block_ids)), dtype=torch.uint8)
    payload_slabs = _block_slabs(_check_payload(out, layout, len(src_block_ids)), layout, len(src_block_ids))
    cache_slabs = _block_slabs(kv_cache, layout, layout.num_blocks)
    for payload_index, block_id in enumerate(src_block_ids):
        payload_slabs[:, payload_index] = cache_slabs[:, block_id]
    return out


def scatter_payload(
    payload: torch.Tensor, kv_cache: torch.Tensor, layout: KVCacheLayout, dst_block_ids: Sequence[int]
) -> None:
    """Write payload block i into `dst_block_ids[i]` of every layer; nothing else is touched."""
    payload_slabs = _block_slabs(_check_payload(payload, layout, len(dst_block_ids)), layout, len(dst_block_ids))
    cache_slabs = _block_slabs(kv_cache, layout, layout.num_blocks)
    for payload_index, block_id in enumerate(dst_block_ids):
        cache_slabs[:, block_id] = payload_slabs[:, payload_index]


def payload_crc32(payload: torch.Tensor) -> int:
    """CRC-32 (zlib's polynomial and values) of a 1-D uint8 payload.

    Uses ISA-L (`isal` package, ~28 GB/s here) when installed, else zlib (~4 GB/s).
    """
    return _crc32(as_numpy_bytes(payload))


def as_numpy_bytes(payload: torch.Tensor) -> np.ndarray:
    """A zero-copy numpy view of a 1-D uint8 CPU tensor, the form ucxx sends and receives."""
    return payload.numpy()
