"""An engine instance's Prometheus metrics: its registry, the engine collector, the request
latency histograms (observed on the engine thread), the role's own counters, and the
`/metrics` listener on `--metrics-port` (-1: none; 0: a free port, announced in the log and
the ready file).

Every series is labelled model_name, role and instance_id. The role's counters (KV bytes,
seconds, transfers and failures by direction, from the engine's KV connector; lease expiries,
Redis mirror failures from the handlers and the presence) are read at scrape time.
"""

from collections.abc import Iterator

from prometheus_client.registry import Collector

from shared.metrics.engine_collector import EngineCollector
from shared.metrics.families import FamilyMaker
from shared.metrics.registry import new_registry
from shared.metrics.request_latency import RequestLatencyTracker
from shared.kv_transfer.types import KVTransferCounts
from services.observability.memory_metrics import InstanceMemory
from services.observability.metrics_server import MetricsServer

METRICS_OFF = -1


class RoleCollector(Collector):
    """Counters of the role handlers and the Redis presence, read at scrape time."""

    def __init__(self, runtime, labels: dict[str, str]):
        self.runtime = runtime  # services.instance.runtime.InstanceRuntime
        self.make = FamilyMaker(labels)

    def collect(self) -> Iterator:
        make = self.make
        yield make.gauge("pdserve:instance_info", "Always 1; its labels name the instance.", 1)
        yield make.gauge("pdserve:instance_draining", "1 while draining (health NOT_SERVING).",
                         int(self.runtime.is_draining))
        transfers = self._transfer_counters()
        for suffix, attribute, documentation in (
                ("bytes", "total_bytes", "KV payload bytes moved, by direction."),
                ("seconds", "total_seconds", "Seconds spent moving KV, by direction."),
                ("transfers", "num_transfers", "KV transfers completed, by direction."),
                ("failures", "num_failed", "KV transfers failed, by direction.")):
            yield make.labelled_counter(f"pdserve:kv_transfer_{suffix}", documentation, "direction",
                                        [(d, getattr(c, attribute)) for d, c in transfers])
        yield from self._transport_gauges()
        decode = self._handler("decode")
        if decode is not None:
            yield make.counter("pdserve:lease_expiries", "Reservations freed because their lease ran out.",
                               decode.leases.num_lease_expiries)
            budget = decode.local_prefills
            yield make.labelled_counter("pdserve:local_prefills", "Local prefills (PrefillLocally: the prompt "
                                        "computed on this decode instance), admitted or refused for lack of room.",
                                        "outcome", [("admitted", budget.num_admitted), ("refused", budget.num_refused)])
            yield make.gauge("pdserve:local_prefill_tokens", "Uncached prompt tokens of the local prefills being "
                             "computed now.", budget.num_tokens)
        prefill = self._handler("prefill")
        if prefill is not None and prefill.peers.is_enabled:
            yield make.gauge("pdserve:kv_peer_pulls_in_flight", "Prefixes this instance is pulling from peers now.",
                             prefill.peers.num_in_flight)
        peer = self._handler("peer")
        if peer is not None:
            yield make.counter("pdserve:kv_peer_sends", "Prefixes this instance sent to peers that pulled them.",
                               peer.num_sends)
            yield make.counter("pdserve:kv_peer_send_blocks", "KV blocks this instance sent to pulling peers.",
                               peer.num_blocks_sent)
            yield make.counter("pdserve:kv_peer_send_refusals", "Pulls refused: this instance no longer held "
                               "every block asked for.", peer.num_refused)
        presence = self.runtime.presence
        if presence is not None:
            yield make.counter("pdserve:lease_mirror_failures", "Lease writes to Redis dropped or failed.",
                               presence.lease_mirror.num_failures)

    def _transport_gauges(self) -> Iterator:
        """What the KV transport holds now: reused connections and abandoned operations (a
        restarted peer must not leave them growing)."""
        kv, make = self.runtime.engine.latest_status().kv_transfer, self.make
        yield make.gauge("pdserve:kv_transfer_idle_endpoints", "KV-transfer connections kept for reuse "
                         "(sender side, every receiver address).", kv.num_idle_endpoints)
        yield make.gauge("pdserve:kv_transfer_idle_addresses", "Receiver addresses with a KV-transfer "
                         "connection kept for reuse.", kv.num_idle_addresses)
        yield make.gauge("pdserve:kv_transfer_lingering_operations", "Transport operations of abandoned "
                         "KV transfers still pending (their buffers are kept until they end).", kv.num_lingering)
        if self._handler("decode") is not None:
            yield make.labelled_counter("pdserve:kv_transfer_late_writes_refused", "KV transfers refused because "
                                        "they came too late: their request no longer expected (aborted, done), "
                                        "withdrawn mid-payload, or superseded by a retry.", "reason",
                                        sorted(kv.late_writes_refused.items()))

    def _handler(self, kind: str):
        handlers = self.runtime.handlers
        return getattr(handlers, kind, None) if handlers is not None else None

    def _transfer_counters(self) -> list[tuple[str, KVTransferCounts]]:
        """By direction, for the directions this role moves KV in (from the engine's connector)."""
        kv = self.runtime.engine.latest_status().kv_transfer
        found = []
        if self._handler("prefill") is not None:
            found.append(("sent", kv.sent))
        if self._handler("decode") is not None:
            found.append(("received", kv.received))
        return found


class InstanceMetrics:
    """Built by InstanceRuntime once the engine has loaded (the model name is known then)."""

    def __init__(self, runtime, model_name: str):
        self.labels = {"model_name": model_name, "role": runtime.role, "instance_id": runtime.instance_id}
        self.registry = new_registry()
        lora = runtime.settings.role_engine_args().create_engine_config().lora
        self.registry.register(EngineCollector(runtime.engine.latest_status, self.labels, runtime.peer_tier_stats,
                                               max_loras=lora.max_loras if lora.enable_lora else 0))
        self.registry.register(RoleCollector(runtime, self.labels))
        self.registry.register(InstanceMemory(runtime).collector(self.labels))
        self.tracker = RequestLatencyTracker(self.registry, self.labels)
        self.server = MetricsServer(self.registry)

    def start(self, host: str, port: int) -> str:
        """Serve `/metrics` unless port is METRICS_OFF; returns the address ("" when off)."""
        return "" if port == METRICS_OFF else self.server.start(host, port)

    def stop(self) -> None:
        self.server.stop()
