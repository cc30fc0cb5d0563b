"""Where a prefill instance's memory goes, per request kind (a diagnostic, not a benchmark).

Runs what a prefill instance runs, in one process: the engine on its own thread (AsyncEngine),
prompts held after their first token by a KV connector that gathers their KV into staging
buffers the way the UCX connector's KVSender does (no wire), then released. Prints RSS, glibc's totals and tracemalloc's Python bytes after
every batch, so a leak (in-use bytes grow) can be told from fragmentation (free bytes grow).

    python -m benchmarks.memory_probe --kinds plain long logprobs guided cancelled --batches 6
"""

import argparse
import importlib
import asyncio
import json
import random
import time
import tracemalloc

import numpy as np

from shared.engine.async_engine import AsyncEngine
from shared.engine.llm_engine import LLMEngine
from shared.engine_api.client import GenerateRequest, KVSendParams
from shared.guided.params import GuidedDecodingParams
from shared.kv_transfer.base import KVConnector
from shared.kv_transfer.types import (
    FinishedTransfers, KVConnectorRole, KVTransferConfig, KVTransferOutcome, KVTransferResult,
)
from shared.kv_transfer.ucx.chunks import (DEFAULT_CHUNK_BYTES, choose_rows_per_chunk, gather_chunk, message_view,
                                           plan_chunks, staging_bytes)
from shared.kv_transfer.ucx.staging import StagingPool
from shared.memory.idle_trim import HeapTrimmer, TrimPolicy
from shared.memory.malloc_stats import malloc_stats, release_free_memory
from shared.memory.process import resident_bytes
from shared.model import row_buckets
from shared.sampling.params import SamplingParams
from benchmarks.engine_flags import add_engine_arguments, engine_args_from

MIB = 1 << 20
KIND_PROMPT_LENGTHS = {"plain": (50, 400), "long": (1000, 1500), "logprobs": (50, 400),
                       "guided": (50, 200), "cancelled": (800, 1500)}


def params_for(kind: str, index: int) -> SamplingParams:
    if kind == "logprobs":
        return SamplingParams(max_tokens=1, logprobs=5, temperature=0.8, seed=index)
    if kind == "guided":
        schema = {"type": "object", "properties": {f"field_{index}": {"type": "integer"}},
                  "required": [f"field_{index}"]}
        return SamplingParams(max_tokens=1, guided=GuidedDecodingParams(json_schema=json.dumps(schema)))
    return SamplingParams(max_tokens=1, temperature=0)


class StagingConnector(KVConnector):
    """A producer that gathers each finished prompt's KV into a staging buffer, then reports it sent."""

    staging: StagingPool | None = None  # set by main

    def __init__(self, config, kv_access):
        super().__init__(config, kv_access)
        self._sent: list[KVTransferOutcome] = []

    def update_state_after_alloc(self, request_id, block_ids, num_external_tokens, transfer_token) -> None:
        raise NotImplementedError("a producer only")

    def request_finished(self, request_id: str, block_ids: list[int], send) -> bool:
        if send is None:
            return False
        kv_cache, layout, src_block_ids = self.kv_access.blocks_for_send(block_ids)
        rows = choose_rows_per_chunk(layout, len(src_block_ids), DEFAULT_CHUNK_BYTES)
        chunks = plan_chunks(layout, len(src_block_ids), rows, True)
        buffer = self.staging.acquire(staging_bytes(chunks))
        for chunk in chunks:
            gather_chunk(kv_cache, layout, np.asarray(src_block_ids, dtype=np.int64), chunk,
                         message_view(buffer, chunk), True)
        self.staging.release(buffer)
        self._sent.append(KVTransferOutcome(request_id, KVTransferResult(staging_bytes(chunks), 0.0)))
        return True

    def cancel(self, request_id: str) -> None:
        pass

    def get_finished(self) -> FinishedTransfers:
        sent, self._sent = self._sent, []
        return FinishedTransfers(sending=tuple(sent))


async def run_one(async_engine: AsyncEngine, kind: str, index: int, rng: random.Random) -> None:
    low, high = KIND_PROMPT_LENGTHS[kind]
    prompt = tuple(rng.randrange(100, 40000) for _ in range(rng.randint(low, high)))
    send = KVSendParams("staging", f"{kind}-{index}", (), 0, b"") if StagingConnector.staging is not None else None
    async for _ in async_engine.generate(GenerateRequest(f"{kind}-{index}", prompt, params_for(kind, index),
                                                         kv_send=send)):
        if kind == "cancelled":
            return


def report(label: str, started: float, baseline_python: int, tokens_per_s: float = 0.0) -> None:
    stats = malloc_stats()
    python_bytes = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    print(f"{label:>14} t={time.perf_counter() - started:6.1f}s rss={resident_bytes() / MIB:7.1f} "
          f"heap={stats.heap_bytes / MIB:7.1f} in_use={stats.in_use_bytes / MIB:7.1f} "
          f"free={stats.free_bytes / MIB:7.1f} mmap={stats.mmap_bytes / MIB:6.1f} arenas={stats.num_arenas} "
          f"python={(python_bytes - baseline_python) / MIB:6.2f} MiB prefill={tokens_per_s:6.1f} tok/s", flush=True)


async def main(args: argparse.Namespace) -> None:
    row_buckets.is_enabled = not args.no_buckets
    pool_class = importlib.import_module(args.staging_module).StagingPool
    StagingConnector.staging = None if args.no_staging else pool_class()
    kv_transfer = KVTransferConfig(f"{StagingConnector.__module__}:StagingConnector", KVConnectorRole.PRODUCER)
    engine = LLMEngine.from_config(engine_args_from(args, kv_transfer=kv_transfer).create_engine_config())
    trimmer = None
    if args.busy_trim_mb or args.idle_trim_s:
        policy = TrimPolicy(idle_interval_s=args.idle_trim_s, busy_growth_bytes=int(args.busy_trim_mb * MIB))
        trimmer = HeapTrimmer(policy)
    async_engine = AsyncEngine(engine, on_loop=trimmer.on_loop if trimmer is not None else None)
    await async_engine.start()
    rng, started = random.Random(0), time.perf_counter()
    report("loaded", started, 0)
    if args.tracemalloc:
        tracemalloc.start(10)
    baseline_python = tracemalloc.get_traced_memory()[0] if args.tracemalloc else 0
    first = tracemalloc.take_snapshot() if args.tracemalloc else None
    for batch in range(args.batches):
        batch_started, tokens_before = time.perf_counter(), engine.core.stats.num_prompt_tokens_computed
        for kind in args.kinds:
            await asyncio.gather(*(run_one(async_engine, kind, batch * 1000 + i, rng)
                                   for i in range(args.per_batch)))
        await async_engine.status()  # after the aborts of the cancelled ones
        if args.trim:
            release_free_memory()
        tokens = engine.core.stats.num_prompt_tokens_computed - tokens_before
        report(f"batch {batch}", started, baseline_python, tokens / (time.perf_counter() - batch_started))
    if trimmer is not None:
        print(f"trims: {trimmer.num_busy_trims} busy, {trimmer.num_idle_trims} idle, "
              f"{trimmer.trim_seconds * 1000:.1f} ms inside malloc_trim in all")
    if first is not None:
        for stat in tracemalloc.take_snapshot().compare_to(first, "traceback")[:8]:
            print(stat, "\n   ", "\n    ".join(stat.traceback.format()[-6:]))
    await async_engine.stop()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=list(KIND_PROMPT_LENGTHS), choices=list(KIND_PROMPT_LENGTHS))
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--per-batch", type=int, default=8, help="concurrent requests of each kind per batch")
    add_engine_arguments(parser, "num_threads", num_threads=2)
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) after every batch")
    parser.add_argument("--busy-trim-mb", type=float, default=0.0,
                        help="engine-loop trimmer: trim while busy once RSS grew this many MiB (0: off)")
    parser.add_argument("--idle-trim-s", type=float, default=0.0,
                        help="engine-loop trimmer: idle trims at most this often (0: off)")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--staging-module", default="shared.kv_transfer.ucx.staging",
                        help="where StagingPool comes from")
    parser.add_argument("--no-staging", action="store_true", help="skip gathering the KV into staging")
    parser.add_argument("--no-buckets", action="store_true", help="do not pad matmul rows to buckets")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
