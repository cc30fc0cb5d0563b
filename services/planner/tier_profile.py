"""Measure what loading KV blocks costs from each tier, the way an engine loads them, through
the engine's probe (shared.engine_api.probe): blocks of the engine's own cache stored in a
host-tier arena (in /dev/shm) and a file-tier arena (in the pdserve cache folder), then copied
back into pool blocks with their CRC-32 checked, timed per run of k blocks. Peer points are
the UCX transfers of as many blocks (from transfer_profile): the bytes on the wire. A pull's
fixed part (reserving the prefix, the gRPC hop to the holder, the release) is not in them;
each instance measures it live (docs/kv_tiers.md). The arenas are temporary.
"""

import logging
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from shared.cache_dir import pdserve_cache_dir
from shared.engine_api.probe import EngineProbe
from shared.kv_cache.blocks import blocks_for_tokens

from services.cost_model.perf_profile import TierLoadPoint, TransferPoint

logger = logging.getLogger(__name__)

HOST_TIER_DIR = "/dev/shm"


@dataclass(frozen=True)
class TierPlan:
    run_lengths: tuple[int, ...] = (1, 4, 16, 64)
    repeats: int = 5


QUICK_TIER_PLAN = TierPlan(run_lengths=(1, 4), repeats=1)


def measure_tier_loads(probe: EngineProbe, plan: TierPlan) -> list[TierLoadPoint]:
    """(tier, blocks, seconds) for loading runs of blocks from a host and a file tier."""
    points = []
    for tier, parent in (("host", HOST_TIER_DIR), ("file", str(pdserve_cache_dir()))):
        Path(parent).mkdir(parents=True, exist_ok=True)
        directory = tempfile.mkdtemp(prefix="pdserve-tier-profile-", dir=parent)
        try:
            for num_blocks, seconds in probe.time_tier_loads(directory, plan.run_lengths, plan.repeats):
                points.append(TierLoadPoint(tier, num_blocks, statistics.median(seconds)))
                logger.info("%s tier: %d blocks in %.2f ms", tier, num_blocks, points[-1].seconds * 1e3)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    return points


def peer_points(transfer: list[TransferPoint], block_size: int) -> list[TierLoadPoint]:
    """Peer pulls of as many blocks as each transfer point moved (the wire part only)."""
    return [TierLoadPoint("peer", blocks_for_tokens(point.prompt_tokens, block_size), point.seconds)
            for point in transfer]
