"""A snapshot of a gateway's Prometheus counters and latency histograms, and the interval
statistics (rate, mean lengths, p90 latencies) between two snapshots."""

import urllib.request
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "pdserve:gateway_requests": "requests",
    "pdserve:gateway_requests_completed": "completed",
    "pdserve:gateway_prompt_tokens": "prompt_tokens",
    "pdserve:gateway_generation_tokens": "generation_tokens",
}
HISTOGRAMS = {
    "pdserve:gateway_time_to_first_token_seconds": "ttft",
    "pdserve:gateway_inter_token_latency_seconds": "itl",
}


@dataclass
class GatewaySample:
    """Counter totals and cumulative histogram buckets (upper bound -> count), summed over gateways."""

    counters: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)

    def add(self, other: "GatewaySample") -> "GatewaySample":
        total = GatewaySample(dict(self.counters), {k: dict(v) for k, v in self.buckets.items()})
        for name, value in other.counters.items():
            total.counters[name] = total.counters.get(name, 0.0) + value
        for name, buckets in other.buckets.items():
            mine = total.buckets.setdefault(name, {})
            for bound, count in buckets.items():
                mine[bound] = mine.get(bound, 0.0) + count
        return total


def parse_sample(text: str) -> GatewaySample:
    sample = GatewaySample()
    for family in text_string_to_metric_families(text):
        for metric in family.samples:
            _add_metric(sample, metric.name, metric.labels, metric.value)
    return sample


def _add_metric(sample: GatewaySample, name: str, labels: dict, value: float) -> None:
    counter = COUNTERS.get(name.removesuffix("_total"))
    if counter is not None and name.endswith("_total"):
        sample.counters[counter] = sample.counters.get(counter, 0.0) + value
        return
    histogram = HISTOGRAMS.get(name.removesuffix("_bucket"))
    if histogram is not None and name.endswith("_bucket"):
        buckets = sample.buckets.setdefault(histogram, {})
        bound = float(labels["le"])
        buckets[bound] = buckets.get(bound, 0.0) + value


def scrape(url: str, timeout_s: float = 2.0) -> GatewaySample:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - operator-given URL
        return parse_sample(response.read().decode("utf-8"))


def quantile(delta_buckets: dict[float, float], q: float) -> float | None:
    """The q-quantile of the observations between two snapshots (linear within a bucket)."""
    bounds = sorted(delta_buckets)
    if not bounds or delta_buckets[bounds[-1]] <= 0:
        return None
    rank, lower, below = q * delta_buckets[bounds[-1]], 0.0, 0.0
    for bound in bounds:
        count = delta_buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


@dataclass(frozen=True)
class GatewayInterval:
    request_rate: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    ttft_p90_s: float | None
    itl_p90_s: float | None


def interval_between(before: GatewaySample, after: GatewaySample, seconds: float) -> GatewayInterval:
    def delta(name: str) -> float:
        return max(0.0, after.counters.get(name, 0.0) - before.counters.get(name, 0.0))

    def p90(name: str) -> float | None:
        old = before.buckets.get(name, {})
        return quantile({b: c - old.get(b, 0.0) for b, c in after.buckets.get(name, {}).items()}, 0.9)

    completed = delta("completed")
    per_request = (lambda name: delta(name) / completed) if completed else (lambda name: 0.0)
    return GatewayInterval(delta("requests") / max(seconds, 1e-9), per_request("prompt_tokens"),
                           per_request("generation_tokens"), p90("ttft"), p90("itl"))
