"""Recorder: per-request latencies, per-interval load (what a planner observes), pool sizes
over time, instance-seconds and scale events of one simulation, and its summary."""

from dataclasses import dataclass, field

import numpy as np

from services.simulator.workload import SimRequest


@dataclass
class IntervalLoad:
    arrivals: int = 0
    completed: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)
    queried_tokens: int = 0  # prompt tokens routed to prefill instances
    cached_tokens: int = 0  # of which the chosen instance had cached

    @property
    def prefix_hit_ratio(self) -> float | None:
        return self.cached_tokens / self.queried_tokens if self.queried_tokens else None


@dataclass
class Summary:
    num_requests: int
    num_completed: int
    slo_attainment: float  # TTFT <= SLO and TPOT <= ITL SLO
    ttft_attainment: float
    tpot_attainment: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    itl_p50_s: float  # over all decode tokens (step durations weighted by batch size)
    itl_p99_s: float
    prefill_instance_hours: float
    decode_instance_hours: float
    scale_events: int

    @property
    def instance_hours(self) -> float:
        return self.prefill_instance_hours + self.decode_instance_hours


class Recorder:
    def __init__(self, ttft_slo_s: float, itl_slo_s: float):
        self.slos = (ttft_slo_s, itl_slo_s)
        self.first_token_at: dict[int, float] = {}
        self.ttft: dict[int, float] = {}
        self.tpot: dict[int, float] = {}
        self.num_requests = 0
        self.interval = IntervalLoad()
        self.timeline: list[tuple[float, int, int, int]] = []  # (t, prefill, decode, arrivals)
        self.scale_events = 0
        self.instance_seconds = {"prefill": 0.0, "decode": 0.0}
        self.itl_samples: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0))

    def on_arrival(self, request: SimRequest) -> None:
        self.num_requests += 1
        self.interval.arrivals += 1

    def on_routed(self, request: SimRequest, cached_tokens: int) -> None:
        self.interval.queried_tokens += request.prompt_tokens
        self.interval.cached_tokens += cached_tokens

    def on_first_token(self, request: SimRequest, at: float) -> None:
        self.first_token_at[request.request_id] = at
        self.ttft[request.request_id] = at - request.arrival_s

    def on_done(self, request: SimRequest, at: float) -> None:
        steps = max(1, request.output_tokens - 1)
        tpot = (at - self.first_token_at[request.request_id]) / steps if request.output_tokens > 1 else 0.0
        self.tpot[request.request_id] = tpot
        load = self.interval
        load.completed += 1
        load.prompt_tokens += request.prompt_tokens
        load.output_tokens += request.output_tokens
        load.ttfts.append(self.ttft[request.request_id])
        load.tpots.append(tpot)

    def take_interval(self) -> IntervalLoad:
        load, self.interval = self.interval, IntervalLoad()
        return load

    def on_interval(self, at: float, num_prefill: int, num_decode: int) -> None:
        self.timeline.append((at, num_prefill, num_decode, 0))

    def close(self, end_s: float, instances: list) -> None:
        durations, batches = [], []
        for instance in instances:
            role = "prefill" if instance.name.startswith("prefill") else "decode"
            stopped = instance.life.stopped_s if instance.life.stopped_s is not None else end_s
            self.instance_seconds[role] += stopped - instance.life.launched_s
            if role == "decode":
                durations.append(np.frombuffer(instance.step_durations, dtype=float))
                batches.append(np.frombuffer(instance.step_batches, dtype=np.int32))
        if durations:
            self.itl_samples = (np.concatenate(durations), np.concatenate(batches))

    def summary(self) -> Summary:
        ids = sorted(self.tpot)
        ttft = np.array([self.ttft[i] for i in ids]) if ids else np.zeros(1)
        tpot = np.array([self.tpot[i] for i in ids]) if ids else np.zeros(1)
        ttft_ok, tpot_ok = ttft <= self.slos[0], tpot <= self.slos[1]
        rate = lambda ok: float(np.mean(ok)) if ids else 0.0  # noqa: E731
        itl50, itl99 = weighted_quantiles(*self.itl_samples, (0.5, 0.99))
        p = lambda values, q: float(np.quantile(values, q))  # noqa: E731
        return Summary(self.num_requests, len(ids), rate(ttft_ok & tpot_ok), rate(ttft_ok), rate(tpot_ok), p(ttft, .5), p(ttft, .9), p(ttft, .99),
                       p(tpot, .5), p(tpot, .9), p(tpot, .99), itl50, itl99,
                       self.instance_seconds["prefill"] / 3600, self.instance_seconds["decode"] / 3600,
                       self.scale_events)


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, quantiles) -> list[float]:
    if values.size == 0 or weights.sum() == 0:
        return [0.0 for _ in quantiles]
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order]) / weights.sum()
    return [float(values[order][min(np.searchsorted(cumulative, q), values.size - 1)]) for q in quantiles]
