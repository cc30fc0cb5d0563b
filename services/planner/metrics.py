"""The planner's Prometheus metrics: its desired replicas per pool, what it observed, its
forecast and how many scale events it decided (`pdserve:planner_*`)."""

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.metrics.registry import new_registry

from services.observability.metrics_server import MetricsServer
from services.planner.planner import PlanDecision

OBSERVED = {
    "request_rate": "Requests per second arriving at the gateways.",
    "mean_prompt_tokens": "Mean prompt length of requests completed in the interval.",
    "mean_output_tokens": "Mean output length of requests completed in the interval.",
    "prefill_queue_depth": "Prompts queued or running on prefill instances.",
    "decode_running": "Sequences decoding on decode instances.",
    "decode_queue_depth": "Requests reserved or waiting on decode instances.",
    "kv_usage": "Used fraction of the decode instances' KV blocks.",
    "prefix_hit_ratio": "Share of prompt tokens the prefill instances found in their prefix caches.",
    "ttft_p90_s": "Gateway time to first token, p90 over the interval, seconds.",
    "itl_p90_s": "Gateway inter-token latency, p90 over the interval, seconds.",
    "num_prefill": "Live prefill instances in Redis.",
    "num_decode": "Live decode instances in Redis.",
}


class PlannerCollector(Collector):
    def __init__(self) -> None:
        self.last: PlanDecision | None = None
        self.events: Counter = Counter()  # (role, action) -> decisions

    def record(self, decision: PlanDecision) -> None:
        self.last = decision
        for pool in (decision.prefill, decision.decode):
            if pool.action != "hold":
                self.events[(pool.role, pool.action)] += 1

    def collect(self) -> Iterator:
        if self.last is None:
            return
        desired = GaugeMetricFamily("pdserve:planner_desired_replicas", "Instances the planner wants, by pool.",
                                    labels=["role"])
        needed = GaugeMetricFamily("pdserve:planner_needed_replicas", "Instances the load needs before bounds "
                                   "and hysteresis, by pool.", labels=["role"])
        for pool in (self.last.prefill, self.last.decode):
            desired.add_metric([pool.role], pool.desired)
            needed.add_metric([pool.role], pool.needed)
        yield desired
        yield needed
        yield GaugeMetricFamily("pdserve:planner_forecast_request_rate", "Forecast requests per second for "
                                "the next interval.", value=self.last.forecast.request_rate)
        for name, documentation in OBSERVED.items():
            value = getattr(self.last.observation, name)
            if value is not None:
                yield GaugeMetricFamily(f"pdserve:planner_observed_{name}", documentation, value=value)
        events = CounterMetricFamily("pdserve:planner_scale_events", "Scale decisions, by pool and action.",
                                     labels=["role", "action"])
        for (role, action), count in sorted(self.events.items()):
            events.add_metric([role, action], count)
        yield events


class PlannerMetrics:
    def __init__(self) -> None:
        self.registry = new_registry()
        self.collector = PlannerCollector()
        self.registry.register(self.collector)
        self.server = MetricsServer(self.registry)
