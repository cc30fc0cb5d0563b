"""The payload as a sequence of chunks: planning them, gathering, checksumming and scattering one.

The payload (see proto/pdserve/v1/kv_transfer.proto) is (2 * num_layers) "rows" of
num_blocks block slabs each; a chunk is a run of whole rows and travels as one ucxx message:
its payload bytes, then, when checksummed, a 4-byte little-endian CRC-32 of those bytes.
KVSender gathers chunk i + 1 from its cache while chunk i is in flight (`gather_chunk`);
KVReceiver writes chunk i into its cache while chunk i + 1 arrives (`scatter_chunk`). Both
sides lay their messages out back to back in one staging buffer (`PayloadChunk.message_offset`).

Copies are single-threaded numpy/torch calls on whole chunks: no per-block Python loop, and
no OpenMP pool whose spinning workers would compete with UCX's threads for the cores. A cache
in GPU memory is staged through the same host buffers (device_copy.py).
"""

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from shared.kv_cache.layout import KVCacheLayout
from shared.kv_transfer.ucx.device_copy import gather_rows_to_host, is_device_cache, scatter_rows_from_host

try:
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # optional speed-up; identical checksums
    _crc32 = zlib.crc32

CRC32_TRAILER_BYTES = 4
DEFAULT_CHUNK_BYTES = 8 << 20  # KVSender's target: a 1024-token SmolLM2 prompt (23.6 MB) goes in 3 chunks
_SAME_SIZE_INTS = {2: (torch.int16, np.int16), 4: (torch.int32, np.int32)}  # itemsize -> (torch, numpy)


@dataclass(frozen=True)
class PayloadChunk:
    """Rows [first_row, end_row) of the payload, for every block; one ucxx message."""

    index: int
    first_row: int
    end_row: int
    num_bytes: int  # payload bytes, without the checksum trailer
    message_offset: int  # where its message starts in a staging buffer
    message_bytes: int  # num_bytes plus the trailer, if any


def num_rows(layout: KVCacheLayout) -> int:
    """Rows in every payload: keys and values of each layer."""
    return 2 * layout.num_layers


def choose_rows_per_chunk(layout: KVCacheLayout, num_blocks: int, target_chunk_bytes: int) -> int:
    """Rows per chunk that split the payload into as few chunks of about `target_chunk_bytes` as
    possible, of even size (a short last chunk would lengthen the pipeline's fill or drain).
    """
    num_chunks = -(-layout.bytes_per_block * num_blocks // max(1, target_chunk_bytes))
    return -(-num_rows(layout) // min(num_chunks, num_rows(layout)))


def plan_chunks(
    layout: KVCacheLayout, num_blocks: int, rows_per_chunk: int, has_crc32: bool
) -> list[PayloadChunk]:
    """The chunks of a `num_blocks`-block payload, in sending order, and where each sits in staging."""
    row_bytes = layout.bytes_per_block * num_blocks // num_rows(layout)
    trailer_bytes = CRC32_TRAILER_BYTES if has_crc32 else 0
    chunks, offset = [], 0
    for index, first_row in enumerate(range(0, num_rows(layout), rows_per_chunk)):
        end_row = min(first_row + rows_per_chunk, num_rows(layout))
        num_bytes = (end_row - first_row) * row_bytes
        chunks.append(PayloadChunk(index, first_row, end_row, num_bytes, offset, num_bytes + trailer_bytes))
        offset += num_bytes + trailer_bytes
    return chunks


def staging_bytes(chunks: Sequence[PayloadChunk]) -> int:
    """Size of a staging buffer holding every chunk's message."""
    return chunks[-1].message_offset + chunks[-1].message_bytes


def message_view(staging: torch.Tensor, chunk: PayloadChunk) -> np.ndarray:
    """`chunk`'s message inside `staging` (1-D uint8 tensor) as a zero-copy numpy view, what ucxx takes."""
    return staging.numpy()[chunk.message_offset:chunk.message_offset + chunk.message_bytes]


def _rows(tensor: torch.Tensor, layout: KVCacheLayout) -> np.ndarray:
    """A cache as a numpy view (rows, num_blocks, elements per block slab) of same-size integers.

    Integers move the exact bits (numpy has no bfloat16).
    """
    torch_int, _ = _SAME_SIZE_INTS[layout.dtype.itemsize]
    return tensor.view(torch_int).numpy().reshape(num_rows(layout), layout.num_blocks, -1)


def _chunk_rows(message: np.ndarray, layout: KVCacheLayout, chunk: PayloadChunk, num_blocks: int) -> np.ndarray:
    """The payload part of a chunk's message viewed (rows in chunk, num_blocks, elements per slab)."""
    _, numpy_int = _SAME_SIZE_INTS[layout.dtype.itemsize]
    return message[:chunk.num_bytes].view(numpy_int).reshape(chunk.end_row - chunk.first_row, num_blocks, -1)


def gather_chunk(
    kv_cache: torch.Tensor, layout: KVCacheLayout, src_block_ids: np.ndarray, chunk: PayloadChunk,
    message: np.ndarray, has_crc32: bool,
) -> None:
    """Fill `message` with `chunk`'s rows of blocks `src_block_ids` (int64 array), then its CRC-32 trailer.

    The ids are checked by the caller; mode="clip" lets numpy write straight into `message`
    (its default mode buffers the output: twice the copying).
    """
    out = _chunk_rows(message, layout, chunk, len(src_block_ids))
    if is_device_cache(kv_cache):
        gather_rows_to_host(kv_cache, layout, src_block_ids, chunk.first_row, chunk.end_row, out)
    else:
        np.take(_rows(kv_cache, layout)[chunk.first_row:chunk.end_row], src_block_ids, axis=1, out=out, mode="clip")
    if has_crc32:
        message[chunk.num_bytes:] = np.frombuffer(_crc32(message[:chunk.num_bytes]).to_bytes(4, "little"), np.uint8)


def chunk_crc32_problem(message: np.ndarray, chunk: PayloadChunk) -> str | None:
    """Why a received message's CRC-32 trailer does not match its bytes, or None if it does."""
    sent_crc32 = int.from_bytes(message[chunk.num_bytes:].tobytes(), "little")
    received_crc32 = _crc32(message[:chunk.num_bytes])
    if sent_crc32 == received_crc32:
        return None
    return f"chunk {chunk.index}: sender {sent_crc32:#010x}, received {received_crc32:#010x}"


def scatter_chunk(
    message: np.ndarray, kv_cache: torch.Tensor, layout: KVCacheLayout, dst_block_ids: np.ndarray,
    chunk: PayloadChunk,
) -> None:
    """Write `chunk`'s slab of payload block i into block `dst_block_ids[i]` (int64 array) of its rows."""
    rows = _chunk_rows(message, layout, chunk, len(dst_block_ids))
    if is_device_cache(kv_cache):
        scatter_rows_from_host(rows, kv_cache, layout, dst_block_ids, chunk.first_row, chunk.end_row)
        return
    _rows(kv_cache, layout)[chunk.first_row:chunk.end_row, dst_block_ids] = rows
