"""KV block transfer between two processes over real UCX (TCP loopback).

The pytest process runs a KVReceiver on one module-wide event loop (ucxx serves a single
loop per process, see shared/kv_transfer/ucx/env.py); a child process (this file run with --sender-service)
runs a KVSender and executes the transfers each test asks for over stdin/stdout JSON lines.
Both sides build their caches with `patterned_cache`, so the test knows every byte the
sender holds and can check the receiver's cache bit for bit.
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from shared.errors import InvalidRequestError  # noqa: E402
from shared.kv_cache.layout import KVCacheLayout  # noqa: E402
from shared.kv_transfer.ucx.env import stop_ucx  # noqa: E402
from shared.kv_transfer.ucx.transport import KVReceiver, KVSender, KVTransferError  # noqa: E402

SENDER_LAYOUT = KVCacheLayout(
    num_layers=2, num_blocks=10, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.bfloat16
)
RECEIVER_LAYOUT = KVCacheLayout(
    num_layers=2, num_blocks=12, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.bfloat16
)
SENDER_SEED, RECEIVER_SEED = 1, 2
TIMEOUT_S = 20.0


def patterned_cache(layout: KVCacheLayout, seed: int) -> torch.Tensor:
    """A cache whose every 16-bit element is a distinct-looking value determined by `seed`."""
    positions = torch.arange(layout.allocate().numel(), dtype=torch.int64)
    bits = (positions * 2654435761 + seed * 40503) % 65536 - 32768
    return bits.to(torch.int16).view(layout.dtype).view(layout.shape)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int16)


# ---- the sender side, run in the child process ---------------------------------------------

async def _send_one(sender: KVSender, address: str, kv_caches: dict, planned: dict) -> dict:
    head_dim = planned.get("head_dim", SENDER_LAYOUT.head_dim)
    layout, kv_cache = kv_caches[head_dim]
    try:
        result = await sender.send(
            address, planned["request_id"], kv_cache, layout, planned["src"], planned["dst"]
        )
    except KVTransferError as error:
        return {"ok": False, "error_type": type(error).__name__, "field": error.field, "message": error.message}
    return {"ok": True, "num_bytes": result.num_bytes}


def _corrupting_gather(real_gather, corrupt_chunk_index: int):
    """Gather and checksum the true chunk, then flip the first byte of one: what a corrupted wire would do."""
    def gather_then_corrupt(kv_cache, layout, src_block_ids, chunk, message, has_crc32) -> None:
        real_gather(kv_cache, layout, src_block_ids, chunk, message, has_crc32)
        if chunk.index == corrupt_chunk_index:
            message[0] ^= 0xFF
    return gather_then_corrupt


async def run_sender_service() -> None:
    """Serve {"address", "transfers": [...], "corrupt_chunk"} lines from stdin; answer one JSON line each.

    chunk_bytes=1 makes every row (one K or V of one layer) a chunk of its own: 4 chunks per transfer.
    """
    import shared.kv_transfer.ucx.sender as ucx_sender
    real_gather = ucx_sender.gather_chunk
    sender = KVSender(chunk_bytes=1)
    kv_caches = {}
    for head_dim in (SENDER_LAYOUT.head_dim, 2 * SENDER_LAYOUT.head_dim):
        layout = KVCacheLayout(**{**SENDER_LAYOUT.__dict__, "head_dim": head_dim})
        kv_caches[head_dim] = (layout, patterned_cache(layout, SENDER_SEED))
    while line := await asyncio.to_thread(sys.stdin.readline):
        command = json.loads(line)
        corrupt_chunk_index = command.get("corrupt_chunk")
        is_corrupting = corrupt_chunk_index is not None
        ucx_sender.gather_chunk = _corrupting_gather(real_gather, corrupt_chunk_index) if is_corrupting else real_gather
        results = await asyncio.gather(
            *[_send_one(sender, command["address"], kv_caches, t) for t in command["transfers"]]
        )
        print(json.dumps(results), flush=True)
    await sender.close()


# ---- the receiver side, in the pytest process ----------------------------------------------

@pytest.fixture(scope="module")
def ucx_loop():
    """`run(coroutine)` on the one event loop every ucxx call of this module uses; tears ucxx down after."""
    stop_ucx()  # a context left by an earlier module would serve that module's (closed) loop
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="ucx-test-loop", daemon=True)
    thread.start()
    yield lambda coroutine: asyncio.run_coroutine_threadsafe(coroutine, loop).result(2 * TIMEOUT_S)
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    stop_ucx()
    loop.close()


@pytest.fixture(scope="module")
def sender_process():
    process = subprocess.Popen(
        [sys.executable, __file__, "--sender-service"], cwd=REPO_ROOT, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    yield process
    process.stdin.close()
    try:
        process.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()


def transfer(request_id: str, src_block_ids: list[int], dst_block_ids: list[int], **extra) -> dict:
    """One transfer for the sender process; `head_dim=16` makes it send from a mismatched cache."""
    return {"request_id": request_id, "src": src_block_ids, "dst": dst_block_ids, **extra}


async def ask_sender(process, address: str, transfers: list[dict], corrupt_chunk: int | None = None) -> list[dict]:
    """Have the sender process run `transfers`; `corrupt_chunk` flips a byte of that chunk of each."""
    command = {"address": address, "transfers": transfers, "corrupt_chunk": corrupt_chunk}
    process.stdin.write(json.dumps(command) + "\n")
    process.stdin.flush()
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), TIMEOUT_S)
    assert line, "sender process exited"
    return json.loads(line)


async def with_receiver(scenario):
    """Run `scenario(receiver, initial_cache)` against a fresh listening receiver."""
    kv_cache = patterned_cache(RECEIVER_LAYOUT, RECEIVER_SEED).clone()
    receiver = KVReceiver(kv_cache, RECEIVER_LAYOUT)
    await receiver.start()
    try:
        return await scenario(receiver, kv_cache)
    finally:
        await receiver.close()


def assert_blocks_landed(kv_cache: torch.Tensor, src_block_ids: list[int], dst_block_ids: list[int]) -> None:
    """dst blocks hold the sender's src blocks bit for bit; every other receiver block is untouched."""
    expected = patterned_cache(RECEIVER_LAYOUT, RECEIVER_SEED).clone()
    expected[:, :, dst_block_ids] = patterned_cache(SENDER_LAYOUT, SENDER_SEED)[:, :, src_block_ids]
    assert torch.equal(bits(kv_cache), bits(expected))


def assert_untouched(kv_cache: torch.Tensor) -> None:
    assert torch.equal(bits(kv_cache), bits(patterned_cache(RECEIVER_LAYOUT, RECEIVER_SEED)))


def test_blocks_arrive_bit_exact_in_destination_slots(sender_process, ucx_loop):
    async def scenario(receiver, kv_cache):
        receiver.expect("req-exact", [5, 0, 11])
        replies, result = await asyncio.gather(
            ask_sender(sender_process, receiver.address, [transfer("req-exact", [2, 9, 3], [5, 0, 11])]),
            receiver.wait("req-exact", TIMEOUT_S),
        )
        block_bytes = 2 * 2 * 4 * 2 * 8 * 2  # K/V * layers * block_size * kv_heads * head_dim * bf16
        assert replies == [{"ok": True, "num_bytes": 3 * block_bytes}]
        assert (result.request_id, result.num_bytes) == ("req-exact", 3 * block_bytes)
        assert (receiver.counters.num_transfers, receiver.counters.total_bytes) == (1, 3 * block_bytes)
        assert_blocks_landed(kv_cache, [2, 9, 3], [5, 0, 11])
    ucx_loop(with_receiver(scenario))


def test_header_mismatch_is_rejected_naming_the_field_on_both_sides(sender_process, ucx_loop):
    async def scenario(receiver, kv_cache):
        receiver.expect("req-shape", [1])
        replies = await ask_sender(sender_process, receiver.address, [transfer("req-shape", [1], [1], head_dim=16)])
        assert replies == [
            {"ok": False, "error_type": "KVTransferRejected", "field": "head_dim", "message": "sender 16, receiver 8"}
        ]
        with pytest.raises(KVTransferError, match=r"^head_dim: sender 16, receiver 8$"):
            await receiver.wait("req-shape", TIMEOUT_S)
        assert receiver.counters.num_failed == 1
        assert_untouched(kv_cache)
    ucx_loop(with_receiver(scenario))


def test_unexpected_request_is_rejected_its_bytes_dropped_and_the_sender_reconnects(sender_process, ucx_loop):
    async def scenario(receiver, kv_cache):
        replies = await ask_sender(sender_process, receiver.address, [transfer("req-stranger", [0], [0])])
        assert replies == [{"ok": False, "error_type": "KVTransferRejected", "field": "request_id",
                            "message": "no transfer expected for 'req-stranger'"}]
        assert_untouched(kv_cache)
        receiver.expect("req-after", [4])
        replies = await ask_sender(sender_process, receiver.address, [transfer("req-after", [6], [4])])
        assert replies[0]["ok"] is True
        await receiver.wait("req-after", TIMEOUT_S)
        assert_blocks_landed(kv_cache, [6], [4])
    ucx_loop(with_receiver(scenario))


def test_wrong_destination_blocks_are_rejected(sender_process, ucx_loop):
    async def scenario(receiver, kv_cache):
        receiver.expect("req-dst", [1, 2])
        replies = await ask_sender(sender_process, receiver.address, [transfer("req-dst", [0, 1], [1, 3])])
        assert replies[0]["message"] == "sender [1, 3], receiver [1, 2]"
        with pytest.raises(KVTransferError, match=r"^dst_block_ids: sender \[1, 3\], receiver \[1, 2\]$"):
            await receiver.wait("req-dst", TIMEOUT_S)
        assert_untouched(kv_cache)
    ucx_loop(with_receiver(scenario))


def test_eight_concurrent_transfers_all_land_exactly(sender_process, ucx_loop):
    src_block_ids = list(range(8))
    dst_block_ids = [11, 3, 7, 0, 9, 5, 2, 10]
    async def scenario(receiver, kv_cache):
        pairs = enumerate(zip(src_block_ids, dst_block_ids))
        transfers = [transfer(f"req-{i}", [src], [dst]) for i, (src, dst) in pairs]
        for planned in transfers:
            receiver.expect(planned["request_id"], planned["dst"])
        replies, *results = await asyncio.gather(
            ask_sender(sender_process, receiver.address, transfers),
            *[receiver.wait(t["request_id"], TIMEOUT_S) for t in transfers],
        )
        assert [reply["ok"] for reply in replies] == [True] * 8
        assert sorted(r.request_id for r in results) == sorted(t["request_id"] for t in transfers)
        assert receiver.counters.num_transfers == 8
        assert_blocks_landed(kv_cache, src_block_ids, dst_block_ids)
    ucx_loop(with_receiver(scenario))


def test_corrupted_payload_fails_the_checksum_and_writes_nothing(sender_process, ucx_loop):
    async def scenario(receiver, kv_cache):
        receiver.expect("req-corrupt", [3, 4])
        replies = await ask_sender(
            sender_process, receiver.address, [transfer("req-corrupt", [0, 1], [3, 4])], corrupt_chunk=0
        )
        assert (replies[0]["ok"], replies[0]["field"]) == (False, "chunk_crc32")
        expected_error = r"^chunk_crc32: chunk 0: sender 0x[0-9a-f]{8}, received 0x[0-9a-f]{8}$"
        with pytest.raises(KVTransferError, match=expected_error):
            await receiver.wait("req-corrupt", TIMEOUT_S)
        assert_untouched(kv_cache)
    ucx_loop(with_receiver(scenario))


def test_corrupted_later_chunk_stops_the_transfer_after_the_chunks_before_it(sender_process, ucx_loop):
    """Each row is a chunk here (K layer 0, K layer 1, V layer 0, V layer 1): rows 0 and 1 land, then it stops."""
    async def scenario(receiver, kv_cache):
        receiver.expect("req-late-corrupt", [3, 4])
        replies = await ask_sender(
            sender_process, receiver.address, [transfer("req-late-corrupt", [0, 1], [3, 4])], corrupt_chunk=2
        )
        assert (replies[0]["ok"], replies[0]["field"]) == (False, "chunk_crc32")
        with pytest.raises(KVTransferError, match=r"^chunk_crc32: chunk 2: sender 0x[0-9a-f]{8}, received 0x"):
            await receiver.wait("req-late-corrupt", TIMEOUT_S)
        expected = patterned_cache(RECEIVER_LAYOUT, RECEIVER_SEED).clone()
        expected[0][:, [3, 4]] = patterned_cache(SENDER_LAYOUT, SENDER_SEED)[0][:, [0, 1]]  # keys: chunks 0 and 1
        assert torch.equal(bits(kv_cache), bits(expected))
        receiver.expect("req-retry", [3, 4])  # the blocks are still the request's: a retry fills them
        replies = await ask_sender(sender_process, receiver.address, [transfer("req-retry", [0, 1], [3, 4])])
        assert replies[0]["ok"] is True
        await receiver.wait("req-retry", TIMEOUT_S)
        assert_blocks_landed(kv_cache, [0, 1], [3, 4])
    ucx_loop(with_receiver(scenario))


def test_wait_times_out_and_withdraws_the_expectation(ucx_loop):
    async def scenario(receiver, kv_cache):
        receiver.expect("req-late", [0])
        expected_error = r"^timeout: request 'req-late': no complete transfer within 0.2 s$"
        with pytest.raises(KVTransferError, match=expected_error):
            await receiver.wait("req-late", 0.2)
        with pytest.raises(InvalidRequestError, match=r"^request_id: 'req-late' is not expected$"):
            await receiver.wait("req-late", 0.2)
    ucx_loop(with_receiver(scenario))


def test_closing_the_receiver_fails_its_waiters():
    async def scenario():
        receiver = KVReceiver(RECEIVER_LAYOUT.allocate(), RECEIVER_LAYOUT)
        receiver.expect("req-orphan", [0])
        waiter = asyncio.ensure_future(receiver.wait("req-orphan", TIMEOUT_S))
        await asyncio.sleep(0)
        await receiver.close()
        with pytest.raises(KVTransferError, match=r"^request_id: 'req-orphan' was withdrawn: the receiver closed$"):
            await waiter
    asyncio.run(scenario())


def test_send_to_an_address_nobody_listens_on_is_a_connection_error(ucx_loop):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    sender = KVSender(timeout_s=0.5)
    kv_cache = SENDER_LAYOUT.allocate()
    # UCX either fails the connection set-up (refused -> canceled request) or never answers it (timeout).
    with pytest.raises(KVTransferError, match=rf"^connection: request 'req-void'.* {address}"):
        ucx_loop(sender.send(address, "req-void", kv_cache, SENDER_LAYOUT, [0], [0]))
    assert (sender.counters.num_transfers, sender.counters.num_failed) == (0, 1)


@pytest.mark.parametrize(
    "address, request_id, src_block_ids, dst_block_ids, error",
    [
        ("127.0.0.1:1", "", [0], [0], "request_id: must not be empty"),
        ("127.0.0.1", "r", [0], [0], "address: expected 'host:port', got '127.0.0.1'"),
        ("127.0.0.1:1", "r", [], [], "src_block_ids: must list at least one block id"),
        ("127.0.0.1:1", "r", [10], [0], r"src_block_ids: block id 10 out of range \[0, 10\)"),
        ("127.0.0.1:1", "r", [0, 1], [3, 3], "dst_block_ids: block ids must be unique"),
        ("127.0.0.1:1", "r", [0, 1], [3], "dst_block_ids: 1 ids for 2 src_block_ids"),
    ],
)
def test_bad_send_arguments_are_invalid_input(address, request_id, src_block_ids, dst_block_ids, error):
    sender = KVSender()
    with pytest.raises(InvalidRequestError, match=f"^{error}$"):
        kv_cache = SENDER_LAYOUT.allocate()
        asyncio.run(sender.send(address, request_id, kv_cache, SENDER_LAYOUT, src_block_ids, dst_block_ids))


def test_bad_expectations_are_invalid_input():
    async def scenario():
        receiver = KVReceiver(RECEIVER_LAYOUT.allocate(), RECEIVER_LAYOUT)
        receiver.expect("req-1", [0])
        for request_id, dst_block_ids, error in [
            ("", [1], "request_id: must not be empty"),
            ("req-1", [1], "request_id: 'req-1' is already expected"),
            ("req-2", [12], r"dst_block_ids: block id 12 out of range \[0, 12\)"),
            ("req-2", [], "dst_block_ids: must list at least one block id"),
        ]:
            with pytest.raises(InvalidRequestError, match=f"^{error}$"):
                receiver.expect(request_id, dst_block_ids)
    asyncio.run(scenario())


if __name__ == "__main__" and sys.argv[1:] == ["--sender-service"]:
    asyncio.run(run_sender_service())
