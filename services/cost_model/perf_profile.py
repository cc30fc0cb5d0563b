"""PerfProfile: what one engine instance costs on this machine, measured by `pdserve profile`.

The planner and the simulator read it. Raw measurements are kept, and two least-squares fits
turn them into smooth, extrapolating cost models:

    prefill_s(new_tokens)          = a + b * n + c * n^2       (attention is quadratic)
    decode_step_s(batch, context)  = a + b * batch + c * batch * context
    kv_transfer_s(prompt_tokens)   = a + b * n                  (a profile without transfer
                                                                 points gives None)

`colocated_slowdown` is how much slower one instance computes while another instance on the
same host is busy (1.0 when not measured), and `host_cores` how many cores that host has: the
simulator's shared-host model for instances that share a machine.

A prefix hit computes only the uncached tokens, so `prefill_s(prompt, cached)` charges
`prompt - cached` new tokens (the measured hit points show how well that holds).
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

PROFILE_VERSION = 1


@dataclass(frozen=True)
class PrefillPoint:
    prompt_tokens: int
    cached_tokens: int
    seconds: float


@dataclass(frozen=True)
class DecodePoint:
    batch_size: int
    context_tokens: int
    seconds: float  # one engine step


@dataclass(frozen=True)
class TransferPoint:
    prompt_tokens: int
    seconds: float  # the prompt's KV blocks from the prefill's cache into the decode's


@dataclass(frozen=True)
class TierLoadPoint:
    tier: str        # "host", "file" or "peer"
    num_blocks: int
    seconds: float   # loading that run of blocks into the pool (peer: pulled over UCX)


@dataclass
class PerfProfile:
    model: str
    dtype: str
    num_threads: int | None
    block_size: int
    kv_capacity_tokens: int
    prefill: list[PrefillPoint]
    decode: list[DecodePoint]
    prefill_fit: list[float] = field(default_factory=list)
    decode_fit: list[float] = field(default_factory=list)
    version: int = PROFILE_VERSION
    transfer: list[TransferPoint] = field(default_factory=list)
    transfer_fit: list[float] = field(default_factory=list)
    host_cores: int | None = None
    colocated_slowdown: float = 1.0
    # Latency a request's path adds to TTFT beyond the engines' compute and the KV transfer
    # (gateway routing, the Reserve/Prefill/Decode RPCs, the instances' service processes),
    # measured on a real stack with lone requests (benchmarks.sim_validate); 0 if unmeasured.
    request_overhead_s: float = 0.0
    # Loading runs of KV blocks from the host tier, the file tier and a peer (the instances'
    # --kv-cost-profile seeds their load-or-recompute choice with these and the prefill fit).
    tier_loads: list[TierLoadPoint] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.prefill_fit:
            self.prefill_fit = fit_prefill(self.prefill)
        if not self.decode_fit:
            self.decode_fit = fit_decode(self.decode)
        if self.transfer and not self.transfer_fit:
            self.transfer_fit = fit_transfer(self.transfer)
        if self.colocated_slowdown < 1.0:
            raise ValueError(f"colocated_slowdown must be >= 1, got {self.colocated_slowdown}")
        if self.request_overhead_s < 0.0:
            raise ValueError(f"request_overhead_s must be >= 0, got {self.request_overhead_s}")

    def prefill_s(self, prompt_tokens: float, cached_tokens: float = 0.0) -> float:
        """Seconds one instance spends computing this prompt alone."""
        new_tokens = max(1.0, prompt_tokens - cached_tokens)
        a, b, c = self.prefill_fit
        return max(1e-4, a + b * new_tokens + c * new_tokens ** 2)

    def prefill_batch_s(self, new_token_counts: list[float]) -> float:
        """Seconds of one engine step computing these prompts together (the per-step cost `a`
        once, the per-token and attention terms per prompt)."""
        a, b, c = self.prefill_fit
        return max(1e-4, a + sum(b * max(1.0, n) + c * max(1.0, n) ** 2 for n in new_token_counts))

    def decode_step_s(self, batch_size: float, context_tokens: float) -> float:
        """Seconds of one decode step for `batch_size` sequences of `context_tokens` each."""
        a, b, c = self.decode_fit
        return max(1e-4, a + b * batch_size + c * batch_size * context_tokens)

    def kv_transfer_s(self, prompt_tokens: float) -> float | None:
        """Seconds to ship a prompt's KV to a decode instance, or None if not profiled."""
        if not self.transfer_fit:
            return None
        a, b = self.transfer_fit
        return max(1e-5, a + b * prompt_tokens)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def save(self, path: Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: Path) -> "PerfProfile":
        raw = json.loads(Path(path).read_text())
        if raw.get("version") != PROFILE_VERSION:
            raise ValueError(f"{path}: profile version {raw.get('version')!r}, expected {PROFILE_VERSION}")
        raw["prefill"] = [PrefillPoint(**point) for point in raw["prefill"]]
        raw["decode"] = [DecodePoint(**point) for point in raw["decode"]]
        raw["transfer"] = [TransferPoint(**point) for point in raw.get("transfer", [])]
        raw["tier_loads"] = [TierLoadPoint(**point) for point in raw.get("tier_loads", [])]
        for fit, points in (("prefill_fit", "prefill"), ("decode_fit", "decode"), ("transfer_fit", "transfer")):
            if raw[points]:  # derived from the points: refit by this version's rules
                raw.pop(fit, None)
        return cls(**raw)


def _non_negative_lstsq(rows: list[list[float]], targets: list[float], relative: bool = False) -> list[float]:
    """Least squares; a negative coefficient is dropped (set to 0) and the rest refitted.
    `relative` minimizes relative errors instead (each row weighted by 1/target), so short
    prompts and small batches are fitted as closely as long ones, not swamped by their seconds."""
    matrix, vector = np.asarray(rows, dtype=float), np.asarray(targets, dtype=float)
    if relative:
        weights = 1.0 / np.maximum(vector, 1e-9)
        matrix, vector = matrix * weights[:, None], vector * weights
    keep = list(range(matrix.shape[1]))
    while True:
        solution, *_ = np.linalg.lstsq(matrix[:, keep], vector, rcond=None)
        negative = [keep[i] for i, value in enumerate(solution) if value < 0]
        if not negative or len(keep) == 1:
            break
        keep.remove(negative[-1])
    coefficients = [0.0] * matrix.shape[1]
    for index, value in zip(keep, solution):
        coefficients[index] = max(0.0, float(value))
    return coefficients


def fit_prefill(points: list[PrefillPoint]) -> list[float]:
    fresh = [point for point in points if point.cached_tokens == 0] or points
    rows = [[1.0, n, n * n] for n in (p.prompt_tokens - p.cached_tokens for p in fresh)]
    return _non_negative_lstsq(rows, [p.seconds for p in fresh], relative=True)


def fit_decode(points: list[DecodePoint]) -> list[float]:
    rows = [[1.0, p.batch_size, p.batch_size * p.context_tokens] for p in points]
    return _non_negative_lstsq(rows, [p.seconds for p in points])


def fit_transfer(points: list[TransferPoint]) -> list[float]:
    rows = [[1.0, p.prompt_tokens] for p in points]
    return _non_negative_lstsq(rows, [p.seconds for p in points])
