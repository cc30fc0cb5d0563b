"""Who sizes the simulated pools: a fixed P:D, or the real planner (services.planner) fed
with what the simulated cluster would report each interval."""

import numpy as np

from services.planner.config import PlannerConfig
from services.planner.observation import Observation
from services.planner.planner import Planner
from services.cost_model.perf_profile import PerfProfile


class FixedScaler:
    def __init__(self, num_prefill: int, num_decode: int):
        self.sizes = (num_prefill, num_decode)

    def decide(self, cluster, now: float) -> tuple[int, int]:
        cluster.recorder.take_interval()
        return self.sizes


def observe(cluster, interval_s: float) -> Observation:
    load = cluster.recorder.take_interval()
    prefill = [p for p in cluster.prefill if p.life.stopped_s is None]
    decode = [d for d in cluster.decode if d.life.stopped_s is None]
    capacity = sum(cluster.profile.kv_capacity_tokens for _ in decode) or 1
    p90 = lambda values: float(np.quantile(values, 0.9)) if values else None  # noqa: E731
    return Observation(
        request_rate=load.arrivals / interval_s,
        mean_prompt_tokens=load.prompt_tokens / load.completed if load.completed else 0.0,
        mean_output_tokens=load.output_tokens / load.completed if load.completed else 0.0,
        prefill_queue_depth=sum(p.outstanding for p in prefill),
        decode_running=sum(len(d.running) for d in decode), decode_queue_depth=sum(len(d.waiting) for d in decode),
        kv_usage=sum(d.kv_reserved for d in decode) / capacity, ttft_p90_s=p90(load.ttfts), itl_p90_s=p90(load.tpots),
        prefix_hit_ratio=load.prefix_hit_ratio,
        num_prefill=cluster.pool_size("prefill"), num_decode=cluster.pool_size("decode"))


class PlannerScaler:
    def __init__(self, config: PlannerConfig, profile: PerfProfile, num_prefill: int, num_decode: int):
        self.planner = Planner(config, profile, num_prefill, num_decode)
        self.decisions = []

    def decide(self, cluster, now: float) -> tuple[int, int]:
        decision = self.planner.plan(observe(cluster, self.planner.config.interval_s), now)
        self.decisions.append(decision)
        return decision.prefill.desired, decision.decode.desired
