"""Measure what loading KV blocks costs from each tier, the way an engine loads them: blocks
of the engine's own cache stored in a host-tier arena (in /dev/shm) and a file-tier arena (in
the pdserve cache folder), then copied back into pool blocks with their CRC-32 checked, timed
per run of k blocks. Peer points are the UCX transfers of as many blocks (from
transfer_profile): the bytes on the wire. A pull's fixed part (reserving the prefix, the gRPC
hop to the holder, the release) is not in them; each instance measures it live (docs/kv_tiers.md).
The arenas are temporary.
"""

import hashlib
import logging
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from shared.cache_dir import pdserve_cache_dir
from shared.kv_cache.blocks import blocks_for_tokens
from shared.kv_tier.arena import ArenaGeometry, KVArena
from shared.kv_tier.block_copy import copy_block_to_slot, copy_slot_to_block

from services.common.profile_data import TierLoadPoint, TransferPoint

logger = logging.getLogger(__name__)

HOST_TIER_DIR = "/dev/shm"


@dataclass(frozen=True)
class TierPlan:
    run_lengths: tuple[int, ...] = (1, 4, 16, 64)
    repeats: int = 5


QUICK_TIER_PLAN = TierPlan(run_lengths=(1, 4), repeats=1)


def measure_tier_loads(kv_cache, layout, plan: TierPlan) -> list[TierLoadPoint]:
    """(tier, blocks, seconds) for loading runs of blocks from a host and a file tier."""
    num_blocks = min(max(plan.run_lengths), layout.num_blocks)
    points = []
    for tier, parent in (("host", HOST_TIER_DIR), ("file", str(pdserve_cache_dir()))):
        Path(parent).mkdir(parents=True, exist_ok=True)
        directory = tempfile.mkdtemp(prefix="pdserve-tier-profile-", dir=parent)
        try:
            points += _measure_arena(tier, Path(directory), kv_cache, layout, num_blocks, plan)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    return points


def _measure_arena(tier: str, directory: Path, kv_cache, layout, num_blocks: int, plan: TierPlan):
    fingerprint = hashlib.sha256(f"profile-{tier}".encode()).digest()
    arena = KVArena(directory / f"profile.{tier}", fingerprint,
                    ArenaGeometry(layout.bytes_per_block, num_blocks, layout.block_size))
    try:
        hashes = [hashlib.sha256(str(i).encode()).digest() for i in range(num_blocks)]
        tokens = [tuple(range(layout.block_size))] * num_blocks
        arena.put(hashes, tokens, lambda index, slot: copy_block_to_slot(kv_cache, layout, index, slot))
        points = []
        for length in (n for n in plan.run_lengths if n <= num_blocks):
            timings = []
            for _ in range(plan.repeats):
                started = time.perf_counter()
                num_loaded, _ = arena.load_run(hashes[:length], tokens[:length],
                                               lambda index, slot: copy_slot_to_block(slot, kv_cache, layout, index))
                timings.append(time.perf_counter() - started)
                assert num_loaded == length
            points.append(TierLoadPoint(tier, length, statistics.median(timings)))
            logger.info("%s tier: %d blocks in %.2f ms", tier, length, points[-1].seconds * 1e3)
        return points
    finally:
        arena.close()


def peer_points(transfer: list[TransferPoint], block_size: int) -> list[TierLoadPoint]:
    """Peer pulls of as many blocks as each transfer point moved (the wire part only)."""
    return [TierLoadPoint("peer", blocks_for_tokens(point.prompt_tokens, block_size), point.seconds)
            for point in transfer]
