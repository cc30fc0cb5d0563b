"""The process's tracer: off (every call a no-op, the SDK never imported) until
`configure_tracing` installs an OTLP exporter; see the package docstring."""

import json
import logging
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager

from shared.errors import ConfigurationError
from shared.logging_setup.context import set_trace_id_source
from shared.tracing.config import TracingConfig
from shared.tracing.null_span import NULL_SPAN, NullSpanContext

logger = logging.getLogger(__name__)

# How the parent process traces (JSON: endpoint, ratio, resource attributes), for its children.
CHILD_TRACING_ENV_VAR = "PDSERVE_TRACING_INHERITED"
TRACER_NAME = "pdserve"
_NULL_CONTEXT = NullSpanContext()

_tracer = None          # an opentelemetry Tracer once configured
_provider = None        # its SDK TracerProvider (flushed by shutdown_tracing)
_propagator = None      # W3C trace context (traceparent, tracestate)


def is_enabled() -> bool:
    return _tracer is not None


def configure_tracing(config: TracingConfig, service_name: str, attributes: Mapping[str, str] | None = None,
                      exporter=None) -> bool:
    """Export this process's spans as `service_name` when `config` has an endpoint (or to
    `exporter`, a test's SpanExporter, synchronously); True if tracing is on. Children started
    afterwards inherit the set-up through the environment."""
    global _tracer, _provider, _propagator
    shutdown_tracing()
    if not config.is_enabled and exporter is None:
        os.environ.pop(CHILD_TRACING_ENV_VAR, None)
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    resource = Resource.create({**(attributes or {}), "service.name": service_name,
                                "service.namespace": "pdserve", "service.version": _pdserve_version()})
    provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(config)))
    _provider, _tracer = provider, provider.get_tracer(TRACER_NAME)
    _propagator = TraceContextTextMapPropagator()
    set_trace_id_source(current_trace_id)
    os.environ[CHILD_TRACING_ENV_VAR] = json.dumps({"endpoint": config.endpoint, "sample_ratio": config.sample_ratio,
                                                    "attributes": dict(attributes or {})})
    logger.info("tracing on: spans of %s go to %s (sampling %.3g of new traces)", service_name,
                config.endpoint or "a test exporter", config.sample_ratio)
    return True


def configure_child_tracing(service_name: str, attributes: Mapping[str, str] | None = None) -> bool:
    """In a process that pdserve started (engine core): trace as the parent does, if it does."""
    inherited = os.environ.get(CHILD_TRACING_ENV_VAR)
    if not inherited:
        return False
    try:
        fields = json.loads(inherited)
        config = TracingConfig(fields["endpoint"], float(fields["sample_ratio"]))
        merged = {**fields.get("attributes", {}), **(attributes or {})}
    except (ValueError, TypeError, KeyError, ConfigurationError) as error:
        logger.warning("tracing stays off: unreadable %s (%s)", CHILD_TRACING_ENV_VAR, error)
        return False
    return configure_tracing(config, service_name, merged)


def shutdown_tracing() -> None:
    """Export what is buffered and turn tracing off."""
    global _tracer, _provider, _propagator
    provider, _provider, _tracer, _propagator = _provider, None, None, None
    set_trace_id_source(None)
    if provider is not None:
        provider.shutdown()


def span(name: str, attributes: Mapping[str, object] | None = None, kind: str = "internal") -> AbstractContextManager:
    """A span around a `with` block, current inside it (children nest under it); an exception
    leaving the block is recorded on it. Off: one shared no-op."""
    if _tracer is None:
        return _NULL_CONTEXT
    return _tracer.start_as_current_span(name, kind=_span_kind(kind), attributes=attributes)


def start_span(name: str, parent=None, attributes: Mapping[str, object] | None = None,
               start_time_ns: int | None = None, kind: str = "internal"):
    """A span the caller ends (`span.end(end_time=ns)`), child of `parent` (a context from
    `extract_context`, else the current one); not made current. Off: NULL_SPAN."""
    if _tracer is None:
        return NULL_SPAN
    return _tracer.start_span(name, context=parent, kind=_span_kind(kind), attributes=attributes,
                              start_time=start_time_ns)


def inject_context(context=None) -> dict[str, str] | None:
    """The current (or `context`'s) trace context as W3C headers; None when off."""
    if _propagator is None:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=context)
    return carrier or None


def extract_context(carrier: Mapping[str, str] | None):
    """A context whose parent is the span `carrier` names (None when off or absent)."""
    if _propagator is None or not carrier:
        return None
    return _propagator.extract(carrier)


def attach_context(context):
    """Make `context` current; returns the token for `detach_context` (None when off)."""
    if context is None:
        return None
    from opentelemetry import context as otel_context
    return otel_context.attach(context)


def detach_context(token) -> None:
    if token is not None:
        from opentelemetry import context as otel_context
        otel_context.detach(token)


def current_trace_id() -> str | None:
    """The current span's trace id (32 hex digits), sampled or not; None when off or outside one."""
    if _tracer is None:
        return None
    from opentelemetry import trace
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


def add_event(name: str, attributes: Mapping[str, object] | None = None) -> None:
    """An event on the current span (none when off or outside a span)."""
    if _tracer is None:
        return
    from opentelemetry import trace
    trace.get_current_span().add_event(name, attributes or {})


def record_failure(target, code: str, message: str, **attributes) -> None:
    """A failure as an event on `target` (a span) with its gRPC status, and the span's status ERROR."""
    if not target.is_recording():
        return
    from opentelemetry.trace import Status, StatusCode
    target.add_event("failure", {"rpc.grpc.status_code": code, "message": message[:500], **attributes})
    target.set_status(Status(StatusCode.ERROR, f"{code}: {message[:200]}"))


def _span_kind(kind: str):
    from opentelemetry.trace import SpanKind
    try:
        return SpanKind[kind.upper()]
    except KeyError:
        raise ValueError(f"unknown span kind {kind!r}") from None


def _otlp_exporter(config: TracingConfig):
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter(endpoint=config.endpoint, insecure=config.is_insecure)


def _pdserve_version() -> str:
    from importlib import metadata
    try:
        return metadata.version("pdserve")
    except metadata.PackageNotFoundError:
        return "0+unknown"
