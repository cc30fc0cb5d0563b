"""The KV transfer wire format: header checks, payload packing/scattering, checksum, framing."""

import asyncio
import zlib

import pytest
import torch

from shared.errors import InvalidRequestError
from shared.kv_cache.layout import KVCacheLayout
from shared.pb.pdserve.v1 import kv_transfer_pb2 as pb
from shared.transfer.errors import KVTransferError
from shared.transfer.framing import recv_message, send_message
from shared.transfer.staging import StagingPool
from shared.transfer.ucx_env import ucxx
from shared.transfer.wire import (
    FORMAT_VERSION, build_header, check_kv_cache, dtype_to_wire, pack_blocks, payload_crc32, scatter_payload,
    validate_header,
)

# 2 K/V * 2 layers * 4 tokens * 2 heads * 8 dims * 2 bytes = 512 bytes per block
LAYOUT = KVCacheLayout(num_layers=2, num_blocks=6, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.bfloat16)
BLOCK_BYTES = 512


def numbered_cache(layout: KVCacheLayout) -> torch.Tensor:
    """Element i holds the value i (exact in float32; in bf16 distinct enough to tell blocks apart)."""
    return torch.arange(layout.allocate().numel(), dtype=torch.float32).to(layout.dtype).view(layout.shape)


def matching_header(**overrides) -> pb.KVTransferHeader:
    header = build_header("req-1", LAYOUT, [4, 1], payload_crc32=None)
    for name, value in overrides.items():
        if name == "dst_block_ids":
            del header.dst_block_ids[:]
            header.dst_block_ids.extend(value)
        else:
            setattr(header, name, value)
    return header


def test_build_header_describes_the_payload_exactly():
    header = build_header("req-1", LAYOUT, [4, 1], payload_crc32=0xDEADBEEF)
    assert (header.format_version, header.request_id) == (FORMAT_VERSION, "req-1")
    assert (header.num_layers, header.block_size, header.num_kv_heads, header.head_dim) == (2, 4, 2, 8)
    assert header.dtype == pb.KV_DTYPE_BFLOAT16
    assert (header.num_blocks, list(header.dst_block_ids)) == (2, [4, 1])
    assert (header.payload_bytes, header.payload_crc32) == (2 * BLOCK_BYTES, 0xDEADBEEF)
    parsed = pb.KVTransferHeader.FromString(header.SerializeToString())
    assert parsed == header


def test_checksum_is_absent_when_turned_off():
    assert not build_header("req-1", LAYOUT, [0], payload_crc32=None).HasField("payload_crc32")


def test_matching_header_is_accepted():
    validate_header(matching_header(), LAYOUT)


@pytest.mark.parametrize(
    "overrides, error",
    [
        ({"format_version": 2}, "format_version: sender 2, receiver 1"),
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
    ],
)
def test_mismatched_header_is_rejected_naming_the_field(overrides, error):
    with pytest.raises(KVTransferError) as raised:
        validate_header(matching_header(**overrides), LAYOUT)
    assert str(raised.value) == error
    assert raised.value.field == error.split(":")[0]


def test_unsupported_dtype_is_invalid_input():
    supported = r"\(supported: float32, float16, bfloat16\)"
    with pytest.raises(InvalidRequestError, match=rf"^dtype: torch.int8 cannot be transferred {supported}$"):
        dtype_to_wire(torch.int8)


def test_pack_gathers_keys_then_values_layer_by_layer_in_src_order():
    kv_cache = numbered_cache(LAYOUT)
    payload = pack_blocks(kv_cache, LAYOUT, [3, 0])
    assert (payload.dtype, payload.shape) == (torch.uint8, (2 * BLOCK_BYTES,))
    expected = torch.stack([kv_cache[:, :, 3], kv_cache[:, :, 0]], dim=2)
    assert torch.equal(payload, expected.contiguous().view(torch.uint8).flatten())


def test_pack_fills_the_given_buffer_in_place():
    buffer = torch.zeros(BLOCK_BYTES, dtype=torch.uint8)
    assert pack_blocks(numbered_cache(LAYOUT), LAYOUT, [5], out=buffer) is buffer
    assert torch.equal(buffer, numbered_cache(LAYOUT)[:, :, 5].contiguous().view(torch.uint8).flatten())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scatter_writes_exactly_the_destination_blocks(dtype):
    layout = KVCacheLayout(**{**LAYOUT.__dict__, "dtype": dtype})
    source = numbered_cache(layout)
    destination = torch.full(layout.shape, -1.0, dtype=dtype)
    scatter_payload(pack_blocks(source, layout, [0, 2]), destination, layout, [5, 1])
    assert torch.equal(destination[:, :, 5], source[:, :, 0])
    assert torch.equal(destination[:, :, 1], source[:, :, 2])
    untouched = [0, 2, 3, 4]
    assert torch.equal(destination[:, :, untouched], torch.full_like(destination[:, :, untouched], -1.0))


def test_scatter_rejects_a_payload_of_the_wrong_size():
    with pytest.raises(InvalidRequestError, match=r"^payload: 512 bytes, expected 1024$"):
        scatter_payload(torch.zeros(BLOCK_BYTES, dtype=torch.uint8), LAYOUT.allocate(), LAYOUT, [0, 1])


def test_crc32_is_zlib_crc32_of_the_payload_bytes():
    payload = pack_blocks(numbered_cache(LAYOUT), LAYOUT, [1])
    assert payload_crc32(payload) == zlib.crc32(bytes(payload.tolist()))


def test_cache_of_another_layout_is_invalid_input():
    wrong_shape = r"\(2, 2, 5, 4, 2, 8\)"
    with pytest.raises(InvalidRequestError, match=rf"^kv_cache: shape {wrong_shape} torch.bfloat16 does not match"):
        check_kv_cache(torch.zeros((2, 2, 5, 4, 2, 8), dtype=torch.bfloat16), LAYOUT)
    with pytest.raises(InvalidRequestError, match=r"^kv_cache: must be contiguous$"):
        check_kv_cache(LAYOUT.allocate().transpose(3, 4).contiguous().transpose(3, 4), LAYOUT)


def test_staging_pool_reuses_the_smallest_fitting_buffer():
    pool = StagingPool(max_free_buffers=2)
    big, small = pool.acquire(1000), pool.acquire(100)
    big_address, small_address = big.data_ptr(), small.data_ptr()
    pool.release(big)
    pool.release(small)
    reused = pool.acquire(50)
    assert (reused.numel(), reused.data_ptr()) == (50, small_address)
    assert pool.acquire(1000).data_ptr() == big_address
    assert pool.num_free_buffers == 0


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
