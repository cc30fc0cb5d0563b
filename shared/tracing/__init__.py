"""Request tracing with OpenTelemetry: one trace per request across the gateway, the prefill
and decode instances and their engine-core processes, exported over OTLP/gRPC.

Off by default, and then free: nothing of the OpenTelemetry SDK is imported, `span()` hands
back one shared no-op object, and no trace context travels. A process turns it on once with

    configure_tracing(TracingConfig(endpoint="http://collector:4317", sample_ratio=0.1),
                      service_name="pdserve-decode", attributes={"pdserve.instance_id": "decode-0"})

and the processes it starts call `configure_child_tracing("pdserve-engine-core")` to export
the same way. Code marks its phases with `with span("decode.kv_receive", attributes) as s:`;
the W3C `traceparent`/`tracestate` of the current span crosses a process boundary as a plain
dict (`inject_context()` / `extract_context(carrier)`), which gRPC metadata, HTTP headers and
the engine-core messages carry.
"""

from shared.tracing.config import TracingConfig
from shared.tracing.runtime import (NULL_SPAN, add_event, attach_context, configure_child_tracing, configure_tracing,
                                    current_trace_id, detach_context, extract_context, inject_context,
                                    is_enabled, record_failure, shutdown_tracing, span, start_span)

__all__ = ["NULL_SPAN", "TracingConfig", "add_event", "attach_context", "configure_child_tracing", "configure_tracing",
           "current_trace_id", "detach_context", "extract_context", "inject_context", "is_enabled",
           "record_failure", "shutdown_tracing", "span", "start_span"]
