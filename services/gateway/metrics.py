"""The gateway's Prometheus metrics: the client's view of every request.

Counters and gauges are read at scrape time from GatewayStats (requests, failures by status
code, routing decisions by role and reason, retries, failovers, refusals, releases) and from
the cluster view (Redis errors, the live instances of its last listing and the prefill/decode
pairs in it whose cache settings differ: no Redis call per scrape), and from the access
control (per API key id: requests admitted, refused by the per-key limits, running). Latencies are real
histograms observed by RequestTimer as messages reach the client.
They are named `pdserve:gateway_*`, not `vllm:*`: the gateway's time to first token includes
routing, Reserve and the prefill (a pool prefill's first token comes before its KV transfer
ends), and dashboards that sum `vllm:*` series over
all services must not mix the two views. Every series has the `model_name` label.

Served at `GET /metrics` on the HTTP API, and on `--metrics-port` when given.
"""

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import Counter as PromCounter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shared.metrics.buckets import ITL_BUCKETS_S, REQUEST_BUCKETS_S, TTFT_BUCKETS_S
from shared.metrics.families import FamilyMaker
from shared.metrics.registry import new_registry
from services.observability.metrics_server import MetricsServer

from services.gateway.admission import SHED_REASONS

if TYPE_CHECKING:
    from services.gateway.admission import Admission
    from services.gateway.access import AccessControl
    from services.gateway.relay_context import RelayContext
    from services.gateway.served_model import ServedModel

ROLES = ("prefill", "decode", "colocated")


class ServingState(Protocol):
    """What the collector reads, at each scrape, of the gateway's state (services/gateway/state.py,
    which holds these metrics in turn)."""

    model: "ServedModel | None"
    relay: "RelayContext | None"
    admission: "Admission"


class GatewayCollector(Collector):
    def __init__(self, state: ServingState, access: "AccessControl | None" = None):
        self.state = state
        self.access = access

    def collect(self) -> Iterator:
        model, relay = self.state.model, self.state.relay
        if model is None or relay is None:
            return  # not ready: nothing routed yet
        make, stats = FamilyMaker({"model_name": model.name}), relay.stats
        yield make.counter("pdserve:gateway_requests", "Generate requests received.", stats.num_requests)
        yield make.counter("pdserve:gateway_requests_completed", "Requests streamed to the end.", stats.num_completed)
        yield make.counter("pdserve:gateway_requests_cancelled", "Requests the client cancelled (or whose "
                           "deadline passed while streaming).", stats.num_cancelled)
        yield make.labelled_counter("pdserve:gateway_failures", "Failed requests by final gRPC status code.",
                                    "code", sorted(stats.failures.items()))
        yield _routing_family(make, stats.routing)
        yield make.labelled_counter("pdserve:migrations", "Streams moved to another decode instance mid-way "
                                    "(reason: failure, drain or hung).", "reason", sorted(stats.migrations.items()))
        yield make.labelled(CounterMetricFamily, "pdserve:gateway_prefill_placement",
                            "Where prompts were prefilled (prefill_pool or decode_local: conditional "
                            "disaggregation) and why.", ("where", "reason"), sorted(stats.placements.items()))
        yield make.counter("pdserve:gateway_prefill_retries", "Prefill attempts after a failed one.",
                           stats.num_prefill_retries)
        yield make.counter("pdserve:gateway_decode_refusals", "Reserve calls refused for lack of room.",
                           stats.num_decode_refusals)
        yield make.labelled_counter("pdserve:gateway_failovers", "Instances skipped after failing a call, by role.",
                                    "role", [("decode", stats.num_decode_failovers),
                                             ("colocated", stats.num_colocated_failovers)])
        yield make.counter("pdserve:gateway_reserve_rounds_repeated", "Requests whose Reserve calls no decode "
                           "instance answered, tried on every instance once more.", stats.num_reserve_rounds_repeated)
        yield make.counter("pdserve:gateway_decode_room_waits", "Requests that every decode instance refused for "
                           "want of free KV blocks and that waited their turn for room.", relay.room.num_waited)
        yield make.gauge("pdserve:gateway_requests_waiting_decode_room", "Requests waiting their turn for room on "
                         "the decode pool now.", relay.room.num_waiting)
        yield make.counter("pdserve:gateway_releases", "Reservations given back because Decode never started.",
                           stats.num_releases)
        yield make.counter("pdserve:gateway_lease_renewals", "Decode leases renewed while the prompt was queued "
                           "or running on a prefill instance.", stats.num_lease_renewals)
        yield from _admission_families(make, self.state.admission)
        yield make.counter("pdserve:gateway_stall_probes", "Health probes of instances whose stream brought no "
                           "message for --stall-timeout-s.", stats.num_stall_probes)
        yield make.labelled_counter("pdserve:gateway_hung_instances", "Instances found hung (alive, not "
                                    "answering) by a stalled stream's probe or a control call's timeout, by role.",
                                    "role", sorted(stats.hung_instances.items()))
        yield make.counter("pdserve:gateway_redis_errors", "Failed Redis reads (routing fell back).",
                           relay.view.num_redis_errors)
        if self.access is not None:
            yield from _key_families(make, self.access)
        yield _live_instances_family(make, relay.view)
        yield _draining_instances_family(make, relay.view)
        pairing = relay.view.pairing
        yield make.gauge("pdserve:gateway_live_incompatible_pairs", "Prefill/decode pairs in the last listing "
                         "whose cache settings differ (never paired).", pairing.num_incompatible_pairs)
        yield make.counter("pdserve:gateway_incompatible_pairs", "Prefill/decode pairs found with differing "
                           "cache settings (each logged once while both stay live).", pairing.num_pairs_reported)
        yield make.labelled(CounterMetricFamily, "pdserve:gateway_unknown_request_fields",
                            "HTTP requests carrying a field this server does not know (accepted, "
                            "ignored), by endpoint and field name.", ("endpoint", "field"),
                            stats.unknown_fields.rows())


def _admission_families(make: FamilyMaker, admission: "Admission") -> Iterator:
    """Load shedding (services.gateway.admission): requests shed by reason, this gateway's
    requests waiting for a first token, the latest predicted wait and the measured prompt rate."""
    yield make.labelled_counter("pdserve:gateway_requests_shed", "Requests refused (RESOURCE_EXHAUSTED / 429) by "
                                "reason: predicted_wait (over --max-queue-wait-s or the request's deadline), "
                                "queued_count (--max-queued-per-instance).", "reason",
                                [(reason, admission.num_shed[reason]) for reason in SHED_REASONS])
    yield make.gauge("pdserve:gateway_requests_waiting_first_token", "This gateway's admitted requests "
                     "still waiting for their first token.", admission.num_waiting)
    prediction = admission.last_prediction
    yield make.gauge("pdserve:gateway_predicted_wait_seconds", "The predicted wait for a first token of the "
                     "latest request, admitted or shed.", prediction.wait_s if prediction else 0.0)
    yield make.gauge("pdserve:gateway_prompt_tokens_per_second", "Prompt tokens per second one busy prompt "
                     "instance computes, as measured by this gateway (a prior until measured).",
                     admission.rate.tokens_per_s())


def _routing_family(make: FamilyMaker, routing: Counter) -> CounterMetricFamily:
    rows = [(tuple(key.split(":", 1)), count) for key, count in sorted(routing.items())]
    return make.labelled(CounterMetricFamily, "pdserve:gateway_routing_decisions",
                         "Instances picked, by role and reason (prefix, load, only, retry).", ("role", "reason"), rows)


def _key_families(make: FamilyMaker, access: "AccessControl") -> Iterator:
    """Per API key id (`key-<n>`, or "anonymous" without keys; never the key): requests
    admitted, refused over its rate or concurrency limit, running now; and calls refused for a
    missing or wrong key."""
    stats = access.limiter.stats()
    yield make.labelled(CounterMetricFamily, "pdserve:gateway_key_requests_admitted",
                        "Requests admitted, by API key id.", ("key",),
                        [((s.key_id,), s.num_admitted) for s in stats])
    yield make.labelled(CounterMetricFamily, "pdserve:gateway_key_requests_limited",
                        "Requests refused with RESOURCE_EXHAUSTED (HTTP 429) by the per-key limits, by API key "
                        "id and limit (rate, concurrency).", ("key", "limit"),
                        [row for s in stats for row in (((s.key_id, "rate"), s.num_over_rate),
                                                        ((s.key_id, "concurrency"), s.num_over_concurrency))])
    yield make.labelled(GaugeMetricFamily, "pdserve:gateway_key_requests_running",
                        "Requests running now (what the concurrency limit counts), by API key id.", ("key",),
                        [((s.key_id,), s.num_running) for s in stats])
    yield make.counter("pdserve:gateway_unauthenticated_requests", "Calls refused for a missing or wrong API key.",
                       access.num_unauthenticated)


def _live_instances_family(make: FamilyMaker, view) -> GaugeMetricFamily:
    listing = view._listing or []  # noqa: SLF001 - the cached listing: no Redis call per scrape
    counts = Counter(info.role for info, _ in listing)
    return make.labelled(GaugeMetricFamily, "pdserve:gateway_live_instances",
                         "Live instances taking new work in the gateway's last listing, by role.", ("role",),
                         [((role,), counts[role]) for role in ROLES])


def _draining_instances_family(make: FamilyMaker, view) -> GaugeMetricFamily:
    counts = Counter(info.role for info, _ in view.draining())
    return make.labelled(GaugeMetricFamily, "pdserve:gateway_draining_instances",
                         "Draining instances (registered, given no new work) in the gateway's last listing, "
                         "by role.", ("role",), [((role,), counts[role]) for role in ROLES])


class GatewayMetrics:
    """One per GatewayServer; GatewayState.metrics points at it for RequestTimer."""

    def __init__(self, state: ServingState, access: "AccessControl | None" = None):
        self.registry = new_registry()
        self.registry.register(GatewayCollector(state, access))
        labels = ["model_name"]
        self.ttft = Histogram("pdserve:gateway_time_to_first_token_seconds", "Request received to first "
                              "token sent to the client, seconds.", labels, registry=self.registry,
                              buckets=TTFT_BUCKETS_S)
        self.itl = Histogram("pdserve:gateway_inter_token_latency_seconds", "Between consecutive token "
                             "messages of a completion sent to the client, seconds.", labels,
                             registry=self.registry, buckets=ITL_BUCKETS_S)
        self.e2e = Histogram("pdserve:gateway_e2e_request_latency_seconds", "Request received to its last "
                             "message sent (completed requests), seconds.", labels, registry=self.registry,
                             buckets=REQUEST_BUCKETS_S)
        self.prompt_tokens = PromCounter("pdserve:gateway_prompt_tokens", "Prompt tokens of completed requests.",
                                         labels, registry=self.registry)
        self.generation_tokens = PromCounter("pdserve:gateway_generation_tokens", "Tokens sent to clients.",
                                             labels, registry=self.registry)
        self.server = MetricsServer(self.registry)

    def stop(self) -> None:
        self.server.stop()
