"""Load or recompute: the measured cost of loading k blocks from a tier (or a peer) against
the measured cost of computing their tokens again on this instance now.

Both sides are exponentially weighted means of what this process measured, seeded from
`pdserve profile` (or conservative defaults until then): the load side from every load a
tier did (seconds per block, plus a fixed cost per run for peers: the round trip), the
compute side from this engine's own prompt steps (seconds per token), which already reflect
the current load of the machine (a busy host computes slower, so loading pays more).
"""

from dataclasses import dataclass

EWMA_WEIGHT = 0.2  # of each new measurement
# Steps with fewer prompt tokens than this say little about prefill speed (decode-dominated).
MIN_TOKENS_TO_MEASURE = 64


@dataclass(frozen=True)
class Decision:
    load: bool
    load_seconds: float       # estimated
    recompute_seconds: float  # estimated


class _Mean:
    def __init__(self, seed: float):
        self.value = seed
        self.num_samples = 0

    def add(self, sample: float) -> None:
        self.value = sample if self.num_samples == 0 else (1 - EWMA_WEIGHT) * self.value + EWMA_WEIGHT * sample
        self.num_samples += 1


class CostModel:
    def __init__(self, load_seconds_per_block: dict[str, float], compute_seconds_per_token: float,
                 fixed_load_seconds: dict[str, float] | None = None):
        self._per_block = {tier: _Mean(seconds) for tier, seconds in load_seconds_per_block.items()}
        self._fixed = {tier: _Mean(seconds) for tier, seconds in (fixed_load_seconds or {}).items()}
        self._per_token = _Mean(compute_seconds_per_token)

    def record_load(self, tier: str, num_blocks: int, seconds: float, fixed_seconds: float | None = None) -> None:
        """A run of `num_blocks` loaded from `tier` in `seconds` in all, of which `fixed_seconds`
        did not depend on the blocks (a peer pull's reservation, round trip and release; None:
        the tier's current estimate of it is subtracted)."""
        if fixed_seconds is not None:
            self._fixed.setdefault(tier, _Mean(fixed_seconds)).add(fixed_seconds)
        if num_blocks > 0:
            fixed = fixed_seconds if fixed_seconds is not None else (
                self._fixed[tier].value if tier in self._fixed else 0.0)
            self._per_block[tier].add(max(0.0, seconds - fixed) / num_blocks)

    def record_compute(self, num_tokens: int, seconds: float) -> None:
        """One engine step computed `num_tokens` prompt tokens in `seconds`."""
        if num_tokens >= MIN_TOKENS_TO_MEASURE:
            self._per_token.add(seconds / num_tokens)

    def decide(self, runs: dict[str, int], block_size: int) -> Decision:
        """Load these runs (tier -> blocks) or compute their tokens again, whichever is cheaper."""
        load_s = sum(self._fixed[tier].value if tier in self._fixed else 0.0 for tier in runs)
        load_s += sum(self._per_block[tier].value * num_blocks for tier, num_blocks in runs.items())
        recompute_s = self._per_token.value * block_size * sum(runs.values())
        return Decision(load_s < recompute_s, load_s, recompute_s)

    @property
    def compute_seconds_per_token(self) -> float:
        return self._per_token.value

    def load_seconds_per_block(self, tier: str) -> float:
        return self._per_block[tier].value
