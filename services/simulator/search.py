"""The questions the simulator answers: the least-cost fixed P:D that meets the SLOs on a
trace, and how the planner compares on the same trace."""

from dataclasses import dataclass

from services.planner import sizing
from services.planner.config import PlannerConfig
from services.planner.profile_data import PerfProfile
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
    """Twice what the planner's sizing says the trace's mean load needs (plus 2), per pool:
    enough to leave the other pool's SLO alone without simulating thousands of idle steps."""
    span = max(1e-9, requests[-1].arrival_s - requests[0].arrival_s) if requests else 1.0
    rate = len(requests) / span
    prompt = sum(r.prompt_tokens for r in requests) / max(1, len(requests))
    output = sum(r.output_tokens for r in requests) / max(1, len(requests))
    prefill = sizing.prefill_need(profile, rate, prompt, 0.0, 0, config.ttft_slo_s, config.interval_s, 0.85)
    decode = sizing.decode_need(profile, rate, prompt, output, 0, config.itl_slo_s, config.max_batch)
    return (min(max_per_pool, 2 * prefill.replicas + 2), min(max_per_pool, 2 * decode.replicas + 2))


def least_cost_ratio(profile: PerfProfile, config: SimConfig, requests: list[SimRequest],
                     target: float = 0.9, max_per_pool: int = 512) -> RatioResult:
    """Each pool's smallest size meeting its own SLO with the other pool ample, then grown
    together (the pool whose SLO misses more first) until both are met at `target`."""
    tried = []
    ample_prefill, ample_decode = ample_pools(profile, config, requests, max_per_pool)

    def run(p: int, d: int) -> Summary:
        summary = simulate_fixed(profile, config, requests, p, d)
        tried.append((p, d, round(summary.slo_attainment, 4)))
        return summary

    num_prefill = _smallest(lambda p: run(p, ample_decode).ttft_attainment >= target, 1, ample_prefill)
    num_decode = _smallest(lambda d: run(ample_prefill, d).tpot_attainment >= target, 1, ample_decode)
    summary = run(num_prefill, num_decode)
    while summary.slo_attainment < target and num_prefill + num_decode < 2 * max_per_pool:
        if summary.ttft_attainment <= summary.tpot_attainment:
            num_prefill += 1
        else:
            num_decode += 1
        summary = run(num_prefill, num_decode)
    return RatioResult(num_prefill, num_decode, summary, tried)
