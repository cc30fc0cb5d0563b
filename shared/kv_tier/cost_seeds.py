"""The costs a `pdserve profile` JSON measured, as seeds for the load-or-recompute choice.

Read by name from the profile (its `tier_loads` points and its prefill fit), so the engine
layer needs none of the planner's code: each tier's points give a least-squares line
seconds = fixed + per_block * blocks, and the prefill fit the seconds per prompt token at a
typical chunk (512 tokens).
"""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shared.errors import ConfigurationError

TYPICAL_CHUNK_TOKENS = 512


@dataclass(frozen=True)
class TierCost:
    fixed_seconds: float
    seconds_per_block: float


@dataclass(frozen=True)
class CostSeeds:
    tiers: dict[str, TierCost]          # "host", "file", "peer"
    compute_seconds_per_token: float | None


def load_cost_seeds(path: str) -> CostSeeds:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ConfigurationError("kv_cost_profile", f"cannot read {path}: {error}") from error
    points: dict[str, list[tuple[int, float]]] = {}
    for point in raw.get("tier_loads", []):
        points.setdefault(point["tier"], []).append((int(point["num_blocks"]), float(point["seconds"])))
    tiers = {tier: _fit(found) for tier, found in points.items()}
    fit = raw.get("prefill_fit") or []
    per_token = None
    if len(fit) == 3:
        a, b, c = fit
        per_token = (a + b * TYPICAL_CHUNK_TOKENS + c * TYPICAL_CHUNK_TOKENS ** 2) / TYPICAL_CHUNK_TOKENS
    return CostSeeds(tiers, per_token)


def _fit(points: list[tuple[int, float]]) -> TierCost:
    """seconds = fixed + per_block * blocks, both > 0; where noise makes the line fall or
    start below zero, seconds per block on average instead (no fixed part)."""
    blocks = np.array([n for n, _ in points], dtype=float)
    seconds = np.array([s for _, s in points], dtype=float)
    if len(points) > 1 and np.ptp(blocks) > 0:
        per_block, fixed = np.polyfit(blocks, seconds, 1)
        if per_block > 0 and fixed >= 0:
            return TierCost(float(fixed), float(per_block))
    return TierCost(0.0, float(np.sum(seconds) / max(1.0, float(np.sum(blocks)))))
