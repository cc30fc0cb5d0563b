"""Synthetic workloads: arrival times (Poisson, bursty, day-long diurnal) and per-request
prompt/output lengths, with a share of requests opening with one of a few common prefixes
(system prompts) that prefill instances can cache. Deterministic for a seed."""

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class SimRequest:
    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_id: int | None  # which common prefix it starts with (None: none)
    prefix_tokens: int


@dataclass(frozen=True)
class LengthModel:
    """Lognormal lengths with these medians, clipped to [min, max]."""

    prompt_median: int = 256
    output_median: int = 128
    sigma: float = 0.5
    min_tokens: int = 8
    max_prompt: int = 4096
    max_output: int = 1024
    prefix_share: float = 0.5  # fraction of requests that open with a common prefix
    num_prefixes: int = 8
    prefix_tokens: int = 128

    def draw(self, rng: random.Random, median: int, maximum: int) -> int:
        return int(min(maximum, max(self.min_tokens, round(median * math.exp(rng.gauss(0, self.sigma))))))


def poisson_arrivals(rng: random.Random, rate: float, duration_s: float) -> list[float]:
    return rate_curve_arrivals(rng, lambda t: rate, rate, duration_s)


def rate_curve_arrivals(rng: random.Random, rate_at, peak_rate: float, duration_s: float) -> list[float]:
    """Non-homogeneous Poisson arrivals by thinning: `rate_at(t)` never above `peak_rate`."""
    times, t = [], 0.0
    if peak_rate <= 0:
        return times
    while True:
        t += rng.expovariate(peak_rate)
        if t >= duration_s:
            return times
        if rng.random() * peak_rate <= rate_at(t):
            times.append(t)


def bursty_rate(base_rate: float, burst_factor: float = 4.0, period_s: float = 60.0, burst_s: float = 10.0):
    """`base_rate`, times `burst_factor` for the first `burst_s` of every `period_s`."""
    return lambda t: base_rate * (burst_factor if t % period_s < burst_s else 1.0)


def diurnal_rate(peak_rate: float, trough_fraction: float = 0.15, day_s: float = 86_400.0):
    """A day: lowest at 04:00, highest at 16:00 (a raised cosine between trough and peak)."""
    trough = peak_rate * trough_fraction
    return lambda t: trough + (peak_rate - trough) * 0.5 * (1 - math.cos(2 * math.pi * ((t / day_s - 4 / 24) % 1)))


def make_requests(rng: random.Random, arrivals: list[float], lengths: LengthModel) -> list[SimRequest]:
    requests = []
    for request_id, arrival in enumerate(arrivals):
        prefix_id = rng.randrange(lengths.num_prefixes) if rng.random() < lengths.prefix_share else None
        prefix = lengths.prefix_tokens if prefix_id is not None else 0
        prompt = prefix + lengths.draw(rng, lengths.prompt_median, lengths.max_prompt - prefix)
        output = lengths.draw(rng, lengths.output_median, lengths.max_output)
        requests.append(SimRequest(request_id, arrival, prompt, output, prefix_id, prefix))
    return requests


def make_trace(kind: str, rate: float, duration_s: float, lengths: LengthModel, seed: int = 0,
               day_s: float = 86_400.0) -> list[SimRequest]:
    """kind: "poisson" (rate), "bursty" (rate, x4 bursts), "diurnal" (rate = the day's peak)."""
    rng = random.Random(seed)
    if kind == "poisson":
        arrivals = poisson_arrivals(rng, rate, duration_s)
    elif kind == "bursty":
        arrivals = rate_curve_arrivals(rng, bursty_rate(rate), rate * 4.0, duration_s)
    elif kind == "diurnal":
        arrivals = rate_curve_arrivals(rng, diurnal_rate(rate, day_s=day_s), rate, duration_s)
    else:
        raise ValueError(f"trace kind must be poisson, bursty or diurnal, got {kind!r}")
    return make_requests(rng, arrivals, lengths)
