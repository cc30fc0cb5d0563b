#!/usr/bin/env python3
"""KV block transfer throughput between two processes: ours vs raw ucxx vs a local memcpy.

    .venv/bin/python benchmarks/transfer.py                      # both UCX_TLS settings
    .venv/bin/python benchmarks/transfer.py --tls sm,self,tcp --tokens 512 4096 --iterations 3

Layout: SmolLM2-135M in bf16 (30 layers, 3 KV heads, head dim 64, block size 16), i.e.
368,640 bytes per block. For each prompt length the sender process pushes that many tokens'
blocks (random, scattered source and destination block ids) to a receiver process:
  ours crc / ours   KVSender.send -> KVReceiver with / without the per-chunk CRC-32: header,
                    then the payload in ~--chunk-bytes chunks, pipelined (the sender gathers
                    chunk i + 1 while chunk i is on the wire, the receiver verifies and
                    scatters chunk i while i + 1 arrives), then the ack; timed on the sender
                    until COMPLETED
  raw               one ucxx send of the same number of bytes from a reused buffer + 1-byte ack
  memcpy            torch copy_ of the same number of bytes between two reused buffers, one process
Each UCX_TLS setting runs in fresh processes (UCX reads it once per process). The methods take
turns run by run; the table shows the best (or, --statistic median, the median) of --iterations
runs after one warm-up run. Target: ours/raw >= 0.70. --skip-prefill leaves out the prefill
timing that the 1024-token transfer is compared with.
"""

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from shared.kv_cache.layout import KVCacheLayout  # noqa: E402
from shared.kv_transfer.ucx.chunks import DEFAULT_CHUNK_BYTES  # noqa: E402

TLS_CHOICES = ("tcp,self", "sm,self,tcp")
DEFAULT_TOKENS = (128, 512, 1024, 2048, 4096)
# The prompt length whose transfer time is reported as a share of its prefill time.
PREFILL_SHARE_TOKENS = 1024
NUM_CACHE_BLOCKS = 272  # 4096 tokens / 16 + spare, so ids are scattered
LAYOUT = KVCacheLayout(
    num_layers=30, num_blocks=NUM_CACHE_BLOCKS, block_size=16, num_kv_heads=3, head_dim=64, dtype=torch.bfloat16
)
MAX_BYTES = LAYOUT.bytes_per_block * (max(DEFAULT_TOKENS) // LAYOUT.block_size)
WAIT_TIMEOUT_S = 120.0


# ---- receiver process --------------------------------------------------------------------

class RawReceiver:
    """Raw ucxx baseline: receives `num_bytes` into one reused buffer, answers with 1 byte.

    The sender connects anew after each "raw" command, so a connection serves one size.
    """

    def __init__(self):
        import numpy as np
        self.buffer = np.ones(MAX_BYTES, dtype=np.uint8)  # touched up front: no page faults later
        self.ack = np.zeros(1, dtype=np.uint8)
        self.num_bytes = 0

    async def serve(self, endpoint) -> None:
        from shared.kv_transfer.ucx.env import ucxx
        num_bytes = self.num_bytes
        try:
            while True:
                await endpoint.recv(self.buffer[:num_bytes])
                await endpoint.send(self.ack)
        except ucxx.exceptions.UCXError:
            return


async def run_receiver_service() -> None:
    """Receiver side: JSON commands on stdin ("expect" or "raw"), one JSON answer line each."""
    from shared.kv_transfer.ucx.env import ucxx
    from shared.kv_transfer.ucx.receiver import KVReceiver
    receiver = KVReceiver(LAYOUT.allocate(), LAYOUT)
    raw = RawReceiver()
    raw_listener = ucxx.create_listener(raw.serve, port=0)
    await receiver.start()
    answer({"address": receiver.address, "raw_address": f"127.0.0.1:{raw_listener.port}"})
    while line := await asyncio.to_thread(sys.stdin.readline):
        command = json.loads(line)
        if command["op"] == "raw":
            raw.num_bytes = command["num_bytes"]
            answer({"ready": True})
            continue
        for request_id, dst_block_ids in command["transfers"]:
            receiver.expect(request_id, dst_block_ids)
        answer({"ready": True})
        for request_id, _ in command["transfers"]:
            await receiver.wait(request_id, WAIT_TIMEOUT_S)
        answer({"done": True})
    await receiver.close()
    raw_listener.close()


def answer(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


# ---- sender process ----------------------------------------------------------------------

class ReceiverProcess:
    """The receiver service as a child process, spoken to in JSON lines."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--role", "receiver"], text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        self.addresses = json.loads(self.process.stdout.readline())

    async def ask(self, command: dict) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return await self.read()

    async def read(self) -> dict:
        return json.loads(await asyncio.to_thread(self.process.stdout.readline))

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


async def time_ours(
    sender, receiver: ReceiverProcess, kv_cache: torch.Tensor, num_blocks: int, request_id: str
) -> float:
    """Seconds for one KVSender.send of `num_blocks` scattered blocks, until the receiver's COMPLETED."""
    rng = random.Random(request_id)
    src_block_ids, dst_block_ids = (rng.sample(range(NUM_CACHE_BLOCKS), num_blocks) for _ in range(2))
    await receiver.ask({"op": "expect", "transfers": [(request_id, dst_block_ids)]})
    started = time.perf_counter()
    await sender.send(receiver.addresses["address"], request_id, kv_cache, LAYOUT, src_block_ids, dst_block_ids)
    seconds = time.perf_counter() - started
    await receiver.read()  # "done": the receiver's wait returned too
    return seconds


async def connect_raw(receiver: ReceiverProcess, num_bytes: int):
    """A raw ucxx connection whose receiving side takes `num_bytes`-byte messages."""
    from shared.kv_transfer.ucx.env import ucxx
    from shared.kv_transfer.ucx.sender import parse_address
    await receiver.ask({"op": "raw", "num_bytes": num_bytes})
    return await ucxx.create_endpoint(*parse_address(receiver.addresses["raw_address"]))


async def time_raw(endpoint, buffer, num_bytes: int) -> float:
    """Seconds for one raw ucxx send of `num_bytes` plus its 1-byte ack."""
    import numpy as np
    ack = np.zeros(1, dtype=np.uint8)
    started = time.perf_counter()
    await endpoint.send(buffer[:num_bytes])
    await endpoint.recv(ack)
    return time.perf_counter() - started


def time_memcpy(source: torch.Tensor, destination: torch.Tensor, num_bytes: int) -> float:
    started = time.perf_counter()
    destination[:num_bytes].copy_(source[:num_bytes])
    return time.perf_counter() - started


async def measure_size(senders: dict, receiver: ReceiverProcess, buffers: dict, num_blocks: int, runs: int) -> dict:
    """Seconds per run for each method; the methods take turns run by run, so load spikes hit all alike."""
    num_bytes = num_blocks * LAYOUT.bytes_per_block
    raw_endpoint = await connect_raw(receiver, num_bytes)
    samples = {label: [] for label in [*senders, "raw", "memcpy"]}
    for run in range(runs):
        for label, sender in senders.items():
            request_id = f"{label.replace(' ', '-')}-{num_blocks}-{run}"
            samples[label].append(await time_ours(sender, receiver, buffers["kv_cache"], num_blocks, request_id))
        samples["raw"].append(await time_raw(raw_endpoint, buffers["raw"], num_bytes))
        samples["memcpy"].append(time_memcpy(buffers["raw_torch"], buffers["memcpy_destination"], num_bytes))
    await raw_endpoint.close()
    return samples


def gbps(num_bytes: int, seconds: list[float], statistic: str) -> float:
    """GB/s of the best or the median run, the first (warm-up) run left out."""
    kept = seconds[1:]
    return num_bytes / (min(kept) if statistic == "best" else statistics.median(kept)) / 1e9


async def benchmark_one_tls(tokens: list[int], iterations: int, statistic: str, chunk_bytes: int) -> list[dict]:
    """All measurements for the UCX_TLS already in this process's environment."""
    import numpy as np
    from shared.kv_transfer.ucx.sender import KVSender
    receiver = ReceiverProcess()
    senders = {"ours crc": KVSender(use_checksum=True, timeout_s=WAIT_TIMEOUT_S, chunk_bytes=chunk_bytes),
               "ours": KVSender(use_checksum=False, timeout_s=WAIT_TIMEOUT_S, chunk_bytes=chunk_bytes)}
    raw = np.ones(MAX_BYTES, dtype=np.uint8)
    buffers = {"kv_cache": torch.randn(LAYOUT.shape).to(LAYOUT.dtype), "raw": raw, "raw_torch": torch.from_numpy(raw),
               "memcpy_destination": torch.ones(MAX_BYTES, dtype=torch.uint8)}
    rows = []
    for num_tokens in tokens:
        num_blocks = num_tokens // LAYOUT.block_size
        samples = await measure_size(senders, receiver, buffers, num_blocks, iterations + 1)
        num_bytes = num_blocks * LAYOUT.bytes_per_block
        rows.append({"tokens": num_tokens, "blocks": num_blocks, "MB": num_bytes / 1e6,
                     **{label: gbps(num_bytes, seconds, statistic) for label, seconds in samples.items()}})
    for sender in senders.values():
        await sender.close()
    receiver.stop()
    return rows


def print_table(tls: str, statistic: str, rows: list[dict]) -> None:
    print(f"\nUCX_TLS={tls}  (GB/s, {statistic} run; ratio = ours / raw)")
    print(f"{'tokens':>6} {'blocks':>6} {'MB':>7} {'ours crc':>9} {'ours':>7} {'raw':>7} {'memcpy':>7} "
          f"{'ratio crc':>9} {'ratio':>6}")
    for row in rows:
        print(f"{row['tokens']:>6} {row['blocks']:>6} {row['MB']:>7.1f} {row['ours crc']:>9.2f} {row['ours']:>7.2f} "
              f"{row['raw']:>7.2f} {row['memcpy']:>7.2f} {row['ours crc'] / row['raw']:>9.2f} "
              f"{row['ours'] / row['raw']:>6.2f}")


def measure_prefill_seconds(num_tokens: int, iterations: int) -> float:
    """Best-of wall time of the engine computing one `num_tokens` prompt (bf16, 2 threads)."""
    from shared.engine import LLM, SamplingParams
    torch.set_num_threads(2)
    llm = LLM(dtype="bfloat16", enable_prefix_caching=False)
    prompt = [random.Random(0).randrange(100, 40000) for _ in range(num_tokens)]
    params = SamplingParams(temperature=0, max_tokens=1)
    timings = []
    for _ in range(iterations):
        started = time.perf_counter()
        llm.generate([prompt], params)
        timings.append(time.perf_counter() - started)
    return min(timings)


def print_prefill_share(rows: list[dict], num_tokens: int, iterations: int) -> None:
    row = next((r for r in rows if r["tokens"] == num_tokens), None)
    if row is None:
        return
    prefill_s = measure_prefill_seconds(num_tokens, iterations)
    for label in ("ours crc", "ours"):
        transfer_s = row["MB"] / 1e3 / row[label]
        print(f"{label:>8}: moving a {num_tokens}-token prompt's KV takes {transfer_s * 1e3:.1f} ms, "
              f"{100 * transfer_s / prefill_s:.1f}% of its prefill ({prefill_s * 1e3:.0f} ms; target < 5%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["driver", "receiver"], default="driver")
    parser.add_argument("--tls", help="one UCX_TLS setting; default: each of " + " | ".join(TLS_CHOICES))
    parser.add_argument("--tokens", type=int, nargs="+", default=list(DEFAULT_TOKENS))
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES,
                        help="KVSender's target payload chunk size (default %(default)s)")
    parser.add_argument("--skip-prefill", action="store_true", help="do not time the prefill for comparison")
    parser.add_argument("--statistic", choices=["best", "median"], default="best",
                        help="which run to report (best: least disturbed by other load on the machine)")
    args = parser.parse_args()
    if args.role == "receiver":
        asyncio.run(run_receiver_service())
        return
    if args.tls is None:  # one fresh process pair per setting
        from benchmarks.machine import print_machine

        print_machine(probe_onednn=False)
        for tls in TLS_CHOICES:
            subprocess.run([sys.executable, __file__, "--tls", tls, "--iterations", str(args.iterations),
                            "--statistic", args.statistic, "--chunk-bytes", str(args.chunk_bytes),
                            *(["--skip-prefill"] if args.skip_prefill else []),
                            "--tokens", *map(str, args.tokens)], check=True)
        return
    os.environ["UCX_TLS"] = args.tls  # before ucxx is first imported; the receiver child inherits it
    rows = asyncio.run(benchmark_one_tls(args.tokens, args.iterations, args.statistic, args.chunk_bytes))
    print_table(args.tls, args.statistic, rows)
    if not args.skip_prefill:
        print_prefill_share(rows, PREFILL_SHARE_TOKENS, min(args.iterations, 3))


if __name__ == "__main__":
    main()
