"""An OTLP/gRPC trace receiver in the test process: a gRPC server implementing the OTLP
TraceService (opentelemetry-proto's stubs) on an ephemeral loopback port, which keeps every
span it is sent as a flat CollectedSpan. Services export to `collector.endpoint`."""

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class CollectedSpan:
    service_name: str
    resource: dict[str, object]
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, object]
    events: dict[str, list[tuple[int, dict[str, object]]]] = field(default_factory=dict)
    status_code: int = 0

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def event_time(self, name: str) -> int:
        return self.events[name][0][0]


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _attributes(key_values) -> dict[str, object]:
    return {item.key: _value(item.value) for item in key_values}


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, collector: "OtlpCollector"):
        self.collector = collector

    def Export(self, request, context):
        spans = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                spans.extend(_collected(resource, span) for span in scope_spans.spans)
        self.collector.add(spans)
        return trace_service_pb2.ExportTraceServiceResponse()


def _collected(resource: dict[str, object], span) -> CollectedSpan:
    events: dict[str, list] = {}
    for event in span.events:
        events.setdefault(event.name, []).append((event.time_unix_nano, _attributes(event.attributes)))
    return CollectedSpan(str(resource.get("service.name")), resource, span.name, span.trace_id.hex(), span.span_id.hex(),
                         span.parent_span_id.hex(), span.kind, span.start_time_unix_nano, span.end_time_unix_nano,
                         _attributes(span.attributes), events, span.status.code)


class OtlpCollector:
    def __init__(self):
        self._spans: list[CollectedSpan] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "OtlpCollector":
        self._server.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.stop(grace=None)

    def add(self, spans: list[CollectedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def spans(self, trace_id: str | None = None) -> list[CollectedSpan]:
        with self._lock:
            return [span for span in self._spans if trace_id is None or span.trace_id == trace_id]

    def wait_for(self, trace_id: str, is_complete: Callable[[list[CollectedSpan]], bool],
                 timeout_s: float = 60.0) -> list[CollectedSpan]:
        """The trace's spans once `is_complete(spans)` holds (polled: exporters batch)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans(trace_id)
            if is_complete(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({(span.service_name, span.name) for span in spans})
                raise AssertionError(f"trace {trace_id} incomplete after {timeout_s} s; it has {names}")
            time.sleep(0.1)
