"""The UCX KV transfer's format (shared/kv_transfer/ucx): header checks, payload chunks
(gather, checksum, scatter), framing."""

import asyncio
import zlib

import numpy as np
import pytest
import torch

from shared.errors import ConfigurationError, InternalError
from shared.kv_cache.layout import KVCacheLayout
from shared.kv_transfer.ucx.chunks import (
    PayloadChunk, choose_rows_per_chunk, chunk_crc32_problem, gather_chunk, message_view, plan_chunks, scatter_chunk,
    staging_bytes,
)
from shared.kv_transfer.ucx.env import ucxx
from shared.kv_transfer.ucx.framing import recv_message, send_message
from shared.kv_transfer.ucx.header import build_header, check_kv_cache, dtype_to_wire, validate_header
from shared.kv_transfer.ucx.protocol import FORMAT_VERSION, KVTransferError
from shared.kv_transfer.ucx.staging import MIN_CLASS_BYTES, StagingPool, size_class
from shared.pb.pdserve.v1 import kv_transfer_pb2 as pb

# 2 K/V * 2 layers = 4 rows; a block's slab in one row: 4 tokens * 2 heads * 8 dims * 2 bytes = 128 bytes
LAYOUT = KVCacheLayout(num_layers=2, num_blocks=6, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.bfloat16)
SLAB_BYTES = 128
BLOCK_BYTES = 4 * SLAB_BYTES


def numbered_cache(layout: KVCacheLayout) -> torch.Tensor:
    """Element i holds the value i (exact in float32; in bf16 distinct enough to tell blocks apart)."""
    return torch.arange(layout.allocate().numel(), dtype=torch.float32).to(layout.dtype).view(layout.shape)


def matching_header(**overrides) -> pb.KVTransferHeader:
    header = build_header("req-1", LAYOUT, [4, 1], rows_per_chunk=2, has_chunk_crc32=False)
    for name, value in overrides.items():
        if name == "dst_block_ids":
            del header.dst_block_ids[:]
            header.dst_block_ids.extend(value)
        else:
            setattr(header, name, value)
    return header


def test_build_header_describes_the_payload_exactly():
    header = build_header("req-1", LAYOUT, [4, 1], rows_per_chunk=3, has_chunk_crc32=True)
    assert (header.format_version, header.request_id) == (FORMAT_VERSION, "req-1") == (3, "req-1")
    assert (header.num_layers, header.block_size, header.num_kv_heads, header.head_dim) == (2, 4, 2, 8)
    assert header.dtype == pb.KV_DTYPE_BFLOAT16
    assert (header.num_blocks, list(header.dst_block_ids)) == (2, [4, 1])
    assert (header.payload_bytes, header.rows_per_chunk, header.has_chunk_crc32) == (2 * BLOCK_BYTES, 3, True)
    parsed = pb.KVTransferHeader.FromString(header.SerializeToString())
    assert parsed == header


def test_matching_header_is_accepted():
    validate_header(matching_header(), LAYOUT)


@pytest.mark.parametrize(
    "overrides, error",
    [
        ({"format_version": 1}, "format_version: sender 1, receiver 3"),
        ({"request_id": ""}, "request_id: must not be empty"),
        ({"num_layers": 30}, "num_layers: sender 30, receiver 2"),
        ({"block_size": 16}, "block_size: sender 16, receiver 4"),
        ({"num_kv_heads": 3}, "num_kv_heads: sender 3, receiver 2"),
        ({"head_dim": 64}, "head_dim: sender 64, receiver 8"),
        ({"dtype": pb.KV_DTYPE_FLOAT16}, "dtype: sender float16, receiver bfloat16"),
        ({"dtype": 99}, "dtype: sender unknown(99), receiver bfloat16"),
        ({"num_blocks": 3}, "num_blocks: header says 3 but lists 2 dst_block_ids"),
        ({"dst_block_ids": [4, 6]}, "dst_block_ids: block id 6 out of range [0, 6)"),
        ({"dst_block_ids": [4, 4]}, "dst_block_ids: block ids must be unique"),
        ({"payload_bytes": 100}, "payload_bytes: sender 100, receiver expects 1024 for 2 blocks"),
        ({"rows_per_chunk": 0}, "rows_per_chunk: must be 1 to 4, got 0"),
        ({"rows_per_chunk": 5}, "rows_per_chunk: must be 1 to 4, got 5"),
    ],
)
def test_mismatched_header_is_rejected_naming_the_field(overrides, error):
    with pytest.raises(KVTransferError) as raised:
        validate_header(matching_header(**overrides), LAYOUT)
    assert str(raised.value) == error
    assert raised.value.field == error.split(":")[0]


def test_unsupported_dtype_is_invalid_input():
    supported = r"\(supported: float32, float16, bfloat16\)"
    with pytest.raises(ConfigurationError, match=rf"^dtype: torch.int8 cannot be transferred {supported}$"):
        dtype_to_wire(torch.int8)


def gather_all(kv_cache: torch.Tensor, layout: KVCacheLayout, src_block_ids: list[int], rows_per_chunk: int,
               has_crc32: bool) -> tuple[list[PayloadChunk], torch.Tensor]:
    """Every chunk's message, gathered into one staging buffer the way KVSender lays it out."""
    chunks = plan_chunks(layout, len(src_block_ids), rows_per_chunk, has_crc32)
    staging = torch.zeros(staging_bytes(chunks), dtype=torch.uint8)
    for chunk in chunks:
        gather_chunk(kv_cache, layout, np.array(src_block_ids), chunk, message_view(staging, chunk), has_crc32)
    return chunks, staging


@pytest.mark.parametrize("num_blocks, target_bytes, rows_per_chunk", [
    (2, 256, 1),  # 1024-byte payload, 256-byte rows: 4 chunks
    (2, 511, 2),  # 3 chunks would be uneven (2 + 1 + 1 rows): 2 chunks of 2 rows
    (2, 512, 2),
    (2, 10_000, 4),  # all in one
    (1, 1, 1),  # never less than a row
    (3, 3 * 3 * SLAB_BYTES, 2),  # 1536 bytes over 1152-byte chunks: 2 chunks of 2 rows
])
def test_chunks_split_rows_evenly_into_the_fewest_of_about_the_target_size(num_blocks, target_bytes, rows_per_chunk):
    assert choose_rows_per_chunk(LAYOUT, num_blocks, target_bytes) == rows_per_chunk


def test_chunks_cover_the_rows_in_order_each_message_followed_by_its_trailer():
    row_bytes = 2 * SLAB_BYTES  # 2 blocks
    assert plan_chunks(LAYOUT, 2, rows_per_chunk=3, has_crc32=True) == [
        PayloadChunk(0, first_row=0, end_row=3, num_bytes=3 * row_bytes, message_offset=0,
                     message_bytes=3 * row_bytes + 4),
        PayloadChunk(1, first_row=3, end_row=4, num_bytes=row_bytes, message_offset=3 * row_bytes + 4,
                     message_bytes=row_bytes + 4),
    ]
    without_crc32 = plan_chunks(LAYOUT, 2, rows_per_chunk=3, has_crc32=False)
    offsets_and_sizes = [(c.message_offset, c.message_bytes) for c in without_crc32]
    assert offsets_and_sizes == [(0, 3 * row_bytes), (3 * row_bytes, row_bytes)]
    assert staging_bytes(without_crc32) == 2 * BLOCK_BYTES


@pytest.mark.parametrize("rows_per_chunk", [1, 3, 4])
def test_chunks_together_are_keys_then_values_layer_by_layer_in_src_order(rows_per_chunk):
    kv_cache = numbered_cache(LAYOUT)
    _, staging = gather_all(kv_cache, LAYOUT, [3, 0], rows_per_chunk, has_crc32=False)
    expected = torch.stack([kv_cache[:, :, 3], kv_cache[:, :, 0]], dim=2)
    assert torch.equal(staging, expected.contiguous().view(torch.uint8).flatten())


def test_crc32_trailer_is_zlib_crc32_of_the_chunk_bytes_little_endian():
    chunks, staging = gather_all(numbered_cache(LAYOUT), LAYOUT, [1], rows_per_chunk=2, has_crc32=True)
    for chunk in chunks:
        message = message_view(staging, chunk)
        expected_trailer = zlib.crc32(message[:chunk.num_bytes].tobytes()).to_bytes(4, "little")
        assert message[chunk.num_bytes:].tobytes() == expected_trailer
        assert chunk_crc32_problem(message, chunk) is None


def test_a_flipped_byte_fails_its_chunk_crc32_naming_the_chunk():
    chunks, staging = gather_all(numbered_cache(LAYOUT), LAYOUT, [1], rows_per_chunk=2, has_crc32=True)
    message = message_view(staging, chunks[1])
    sent_crc32 = int.from_bytes(message[-4:].tobytes(), "little")
    message[5] ^= 0x01
    received_crc32 = zlib.crc32(message[:chunks[1].num_bytes].tobytes())
    expected = f"chunk 1: sender {sent_crc32:#010x}, received {received_crc32:#010x}"
    assert chunk_crc32_problem(message, chunks[1]) == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows_per_chunk", [1, 4])
def test_scatter_writes_exactly_the_destination_blocks(dtype, rows_per_chunk):
    layout = KVCacheLayout(**{**LAYOUT.__dict__, "dtype": dtype})
    source = numbered_cache(layout)
    destination = torch.full(layout.shape, -1.0, dtype=dtype)
    chunks, staging = gather_all(source, layout, [0, 2], rows_per_chunk, has_crc32=True)
    for chunk in chunks:
        scatter_chunk(message_view(staging, chunk), destination, layout, np.array([5, 1]), chunk)
    assert torch.equal(destination[:, :, 5], source[:, :, 0])
    assert torch.equal(destination[:, :, 1], source[:, :, 2])
    untouched = [0, 2, 3, 4]
    assert torch.equal(destination[:, :, untouched], torch.full_like(destination[:, :, untouched], -1.0))


def test_scatter_of_one_chunk_writes_only_its_rows():
    source = numbered_cache(LAYOUT)
    destination = torch.full(LAYOUT.shape, -1.0, dtype=LAYOUT.dtype)
    chunks, staging = gather_all(source, LAYOUT, [2], rows_per_chunk=3, has_crc32=False)
    scatter_chunk(message_view(staging, chunks[1]), destination, LAYOUT, np.array([4]), chunks[1])
    assert torch.equal(destination[1, 1, 4], source[1, 1, 2])  # row 3 = values of layer 1
    destination[1, 1, 4] = -1.0
    assert torch.equal(destination, torch.full_like(destination, -1.0))


def test_cache_of_another_layout_is_invalid_input():
    wrong_shape = r"\(2, 2, 5, 4, 2, 8\)"
    with pytest.raises(InternalError, match=rf"^kv_cache: shape {wrong_shape} torch.bfloat16 does not match"):
        check_kv_cache(torch.zeros((2, 2, 5, 4, 2, 8), dtype=torch.bfloat16), LAYOUT)
    with pytest.raises(InternalError, match=r"^kv_cache: must be contiguous$"):
        check_kv_cache(LAYOUT.allocate().transpose(3, 4).contiguous().transpose(3, 4), LAYOUT)


def test_staging_sizes_round_up_to_classes_with_at_most_a_quarter_wasted():
    assert size_class(1) == size_class(MIN_CLASS_BYTES) == MIN_CLASS_BYTES
    assert size_class(MIN_CLASS_BYTES + 1) == MIN_CLASS_BYTES * 5 // 4
    assert size_class(1 << 20) == 1 << 20
    assert size_class((1 << 20) + 1) == (1 << 20) * 5 // 4
    for num_bytes in range(MIN_CLASS_BYTES, 64 << 20, 999_983):
        assert num_bytes <= size_class(num_bytes) < num_bytes * 1.25 + 1


def test_staging_pool_reuses_a_buffer_of_the_same_class():
    pool = StagingPool()
    first = pool.acquire(1_000_000)
    address = first.data_ptr()
    pool.release(first)
    reused = pool.acquire(1_040_000)  # same class (1 MiB)
    assert (reused.numel(), reused.data_ptr()) == (1_040_000, address)
    other = pool.acquire(3_000_000)  # another class: a new buffer
    assert other.data_ptr() != address
    assert pool.num_free_buffers == 0
    assert pool.in_use_bytes == (1 << 20) + size_class(3_000_000)


def test_staging_pool_keeps_at_most_max_free_bytes():
    pool = StagingPool(max_free_bytes=3 << 20)
    views = [pool.acquire(1 << 20) for _ in range(5)]
    for view in views:
        pool.release(view)
    assert (pool.num_free_buffers, pool.free_bytes, pool.in_use_bytes) == (3, 3 << 20, 0)
    pool.discard(pool.acquire(1 << 20))
    assert pool.memory_bytes == 2 << 20


class UnwalkableDict(dict):
    """A pool container that fails any walk over it, as a walk racing the UCX thread may."""

    def values(self):
        raise RuntimeError("OrderedDict mutated during iteration")

    def items(self):
        raise RuntimeError("OrderedDict mutated during iteration")


def test_staging_pool_sizes_are_read_without_walking_its_buffers():
    """The engine's status report reads the sizes on its own thread while the UCX thread changes
    the pool: a read that walks the buffers raised "mutated during iteration" and killed a
    prefill engine core under a 128-request burst."""
    pool = StagingPool(max_free_bytes=3 << 20)
    held = pool.acquire(2 << 20)
    pool.release(pool.acquire(1 << 20))
    pool._free, pool._in_use = UnwalkableDict(pool._free), UnwalkableDict(pool._in_use)
    assert (pool.num_free_buffers, pool.free_bytes, pool.in_use_bytes, pool.memory_bytes) == (
        1, 1 << 20, 2 << 20, 3 << 20)
    assert held.numel() == 2 << 20


class LoopbackEndpoint:
    """Stands in for a ucxx endpoint: each send is queued and lands in the next recv's buffer.

    Like UCX, a message may be shorter than the receive buffer, never longer.
    """

    def __init__(self):
        self.messages: asyncio.Queue = asyncio.Queue()

    async def send(self, buffer) -> None:
        await self.messages.put(bytes(memoryview(buffer).cast("B")))

    async def recv(self, buffer) -> None:
        message = await self.messages.get()
        if len(message) > memoryview(buffer).nbytes:
            raise ucxx.exceptions.UCXMessageTruncatedError("message truncated")
        memoryview(buffer).cast("B")[: len(message)] = message


def test_each_frame_is_one_message():
    async def scenario():
        endpoint = LoopbackEndpoint()
        await send_message(endpoint, pb.KVTransferAck(request_id="req-1", status=pb.KV_TRANSFER_STATUS_COMPLETED))
        await send_message(endpoint, pb.KVTransferAck())  # empty body: the frame is the 8-byte length alone
        num_messages = endpoint.messages.qsize()
        first = await recv_message(endpoint, pb.KVTransferAck, max_bytes=64)
        second = await recv_message(endpoint, pb.KVTransferAck, max_bytes=64)
        return num_messages, first, second
    num_messages, first, second = asyncio.run(scenario())
    assert num_messages == 2
    assert (first.request_id, first.status) == ("req-1", pb.KV_TRANSFER_STATUS_COMPLETED)
    assert second == pb.KVTransferAck()


def test_frame_longer_than_the_limit_is_refused():
    async def scenario():
        endpoint = LoopbackEndpoint()
        await send_message(endpoint, pb.KVTransferAck(message="x" * 100))  # 102-byte body
        await recv_message(endpoint, pb.KVTransferAck, max_bytes=101)
    with pytest.raises(KVTransferError, match=r"^frame: exceeds the 101-byte limit$"):
        asyncio.run(scenario())


def test_frame_whose_length_field_lies_is_refused():
    async def scenario():
        endpoint = LoopbackEndpoint()
        await endpoint.send(bytearray((500).to_bytes(8, "little")) + b"\x00" * 10)
        await recv_message(endpoint, pb.KVTransferAck, max_bytes=100)
    with pytest.raises(KVTransferError, match=r"^frame: says 500 bytes, over the 100-byte limit$"):
        asyncio.run(scenario())


def test_garbled_frame_is_refused():
    async def scenario():
        endpoint = LoopbackEndpoint()
        await endpoint.send(bytearray((3).to_bytes(8, "little")) + b"\xff\xff\xff")
        await recv_message(endpoint, pb.KVTransferAck, max_bytes=100)
    with pytest.raises(KVTransferError, match=r"^frame: not a KVTransferAck: "):
        asyncio.run(scenario())
