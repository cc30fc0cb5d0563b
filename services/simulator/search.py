"""The questions the simulator answers: the least-cost fixed P:D that meets the SLOs on a
trace, and how the planner compares on the same trace."""

from dataclasses import dataclass

from services.planner import sizing
from services.planner.config import PlannerConfig
from services.cost_model.perf_profile import PerfProfile
from services.simulator.cluster import ClusterSim, SimConfig
from services.simulator.recorder import Summary
from services.simulator.scalers import FixedScaler, PlannerScaler
from services.simulator.workload import SimRequest


def simulate_fixed(profile: PerfProfile, config: SimConfig, requests: list[SimRequest],
                   num_prefill: int, num_decode: int) -> Summary:
    cluster = ClusterSim(profile, config, FixedScaler(num_prefill, num_decode), num_prefill, num_decode)
    return cluster.run(requests).summary()


def simulate_planner(profile: PerfProfile, config: SimConfig, planner_config: PlannerConfig,
                     requests: list[SimRequest]) -> tuple[Summary, list]:
    start_p, start_d = planner_config.prefill.min_replicas, planner_config.decode.min_replicas
    scaler = PlannerScaler(planner_config, profile, start_p, start_d)
    recorder = ClusterSim(profile, config, scaler, start_p, start_d).run(requests)
    return recorder.summary(), recorder.timeline


@dataclass(frozen=True)
class RatioResult:
    num_prefill: int
    num_decode: int
    summary: Summary
    tried: list[tuple[int, int, float]]  # (P, D, SLO attainment) of every run
    met: bool = True  # False: even the largest pools searched miss the target

    @property
    def cost(self) -> int:
        return self.num_prefill + self.num_decode


def _smallest(meets, low: int, high: int) -> int:
    """Least n in [low, high] with meets(n) (meets is monotone); high if none."""
    while low < high:
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle + 1
    return low


def ample_pools(profile: PerfProfile, config: SimConfig, requests: list[SimRequest], max_per_pool: int) -> tuple[int, int]:
    """Twice what the planner's sizing says the trace's mean load needs (plus 2), per pool: a
    capacity bound that leaves the other pool's SLO alone without simulating idle instances."""
    span = max(1e-9, requests[-1].arrival_s - requests[0].arrival_s) if requests else 1.0
    rate = len(requests) / span
    prompt = sum(r.prompt_tokens for r in requests) / max(1, len(requests))
    output = sum(r.output_tokens for r in requests) / max(1, len(requests))
    prefill = sizing.prefill_need(profile, rate, prompt, 0.0, 0, config.ttft_slo_s, config.interval_s, 0.85)
    decode = sizing.decode_need(profile, rate, prompt, output, 0, config.itl_slo_s, config.max_batch)
    return (min(max_per_pool, 2 * prefill.replicas + 2), min(max_per_pool, 2 * decode.replicas + 2))


class _Runs:
    """Memoized fixed-P:D simulations of one trace."""

    def __init__(self, profile: PerfProfile, config: SimConfig, requests: list[SimRequest]):
        self.args = (profile, config, requests)
        self.summaries: dict[tuple[int, int], Summary] = {}
        self.tried: list[tuple[int, int, float]] = []

    def __call__(self, num_prefill: int, num_decode: int) -> Summary:
        key = (num_prefill, num_decode)
        if key not in self.summaries:
            self.summaries[key] = simulate_fixed(*self.args, num_prefill, num_decode)
            self.tried.append((num_prefill, num_decode, round(self.summaries[key].slo_attainment, 4)))
        return self.summaries[key]


def least_cost_ratio(profile: PerfProfile, config: SimConfig, requests: list[SimRequest],
                     target: float = 0.9, max_per_pool: int = 512) -> RatioResult:
    """The fewest instances P + D whose SLO attainment reaches `target`, assuming attainment
    never falls when a pool grows (then the answer is exact):

    1. bounds from capacity: pools the planner's sizing calls ample, doubled until they meet
       the target (or reach `max_per_pool`);
    2. lower bounds by bisection per pool: the least P meeting the TTFT target with D ample,
       the least D meeting the ITL target with P ample; then the least P meeting the whole
       target with D ample;
    3. from there, each P's least D by bisection; D never grows with P, and the walk stops
       once P + (least D) cannot beat the best found.
    """
    runs = _Runs(profile, config, requests)
    meets = lambda p, d: runs(p, d).slo_attainment >= target  # noqa: E731
    high_p, high_d = ample_pools(profile, config, requests, max_per_pool)
    while not meets(high_p, high_d) and (high_p < max_per_pool or high_d < max_per_pool):
        high_p, high_d = min(max_per_pool, 2 * high_p), min(max_per_pool, 2 * high_d)
    if not meets(high_p, high_d):
        return RatioResult(high_p, high_d, runs(high_p, high_d), runs.tried, met=False)
    low_p = _smallest(lambda p: runs(p, high_d).ttft_attainment >= target, 1, high_p)
    low_d = _smallest(lambda d: runs(high_p, d).tpot_attainment >= target, 1, high_d)
    num_prefill = _smallest(lambda p: meets(p, high_d), low_p, high_p)
    best: tuple[int, int] | None = None
    while num_prefill <= high_p and (best is None or num_prefill + low_d < sum(best)):
        if meets(num_prefill, high_d):
            num_decode = _smallest(lambda d: meets(num_prefill, d), low_d, high_d)
            if best is None or num_prefill + num_decode < sum(best):
                best = (num_prefill, num_decode)
            high_d = num_decode
        num_prefill += 1
    return RatioResult(best[0], best[1], runs(*best), runs.tried)
