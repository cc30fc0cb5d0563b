"""Request tracing (shared.tracing, services.rpc.tracing_interceptors): off it costs
nothing (no SDK import, one shared no-op span, no context on the wire); on, spans nest,
the W3C trace context crosses gRPC both ways, the trace id comes back as trailing metadata
and is on every log line of the request, and failures are events with their gRPC status.
The end-to-end trace across real processes is tests/e2e/test_tracing.py."""

import asyncio
import io
import json
import logging
import os
import subprocess
import sys

import grpc
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.errors import ConfigurationError
from shared.engine.core_process.request_spans import RequestSpans
from shared.logging_setup import bind_request_id, configure_logging
from shared.tracing import (NULL_SPAN, TracingConfig, configure_child_tracing, configure_tracing, current_trace_id,
                            extract_context, inject_context, is_enabled, record_failure, shutdown_tracing, span)
from shared.tracing.runtime import CHILD_TRACING_ENV_VAR


def current_request_id_var():
    from shared.logging_setup.context import _request_id
    return _request_id

from services.rpc.tracing_interceptors import (TRACE_ID_METADATA, TracingServerInterceptor, client_interceptors,
                                                   server_interceptors)
from services.observability.tracing_setup import TracingSettings, start_tracing, tracing_args

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def exporter(monkeypatch):
    monkeypatch.delenv(CHILD_TRACING_ENV_VAR, raising=False)
    memory = InMemorySpanExporter()
    configure_tracing(TracingConfig(), "pdserve-test", {"pdserve.role": "test"}, exporter=memory)
    yield memory
    shutdown_tracing()
    os.environ.pop(CHILD_TRACING_ENV_VAR, None)


def by_name(exporter) -> dict:
    return {finished.name: finished for finished in exporter.get_finished_spans()}


def test_off_by_default_every_call_is_a_shared_no_op():
    assert not is_enabled()
    with span("anything", {"a": 1}) as first, span("other") as second:
        assert first is second is NULL_SPAN
        first.add_event("ignored")
        record_failure(first, "INTERNAL", "ignored")
    assert inject_context() is None and extract_context({"traceparent": CLIENT_PARENT}) is None
    assert current_trace_id() is None
    assert server_interceptors() == [] and client_interceptors() == []
    assert not start_tracing(TracingSettings(), "decode")


def test_services_import_no_trace_sdk_or_exporter_while_tracing_is_off():
    # (redis-py imports the metrics SDK for observability of its own, off unless configured.)
    code = ("import sys, services.gateway.server, services.instance.entry, shared.engine.core_process.main; "
            "loaded = sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk.trace', "
            "'opentelemetry.exporter', 'opentelemetry.proto'))); print(loaded)")
    env = {key: value for key, value in os.environ.items() if key != CHILD_TRACING_ENV_VAR}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_settings_are_flags_variables_and_file_keys(monkeypatch):
    settings = TracingSettings(otlp_traces_endpoint="http://collector:4317", otlp_traces_sample_ratio=0.25)
    assert tracing_args(settings) == ["--otlp-traces-endpoint=http://collector:4317",
                                      "--otlp-traces-sample-ratio=0.25"]
    assert tracing_args(TracingSettings()) == []
    with pytest.raises(ConfigurationError, match="otlp_traces_sample_ratio"):
        TracingSettings(otlp_traces_sample_ratio=1.5)
    with pytest.raises(ConfigurationError, match="otlp_traces_sample_ratio"):
        TracingConfig("http://c:4317", sample_ratio=-0.1)
    assert TracingSettings.env_name("otlp_traces_endpoint") == "PDSERVE_OTLP_TRACES_ENDPOINT"


def test_spans_nest_and_the_context_crosses_as_w3c_headers(exporter):
    with span("outer", {"pdserve.request_id": "r1"}) as outer:
        with span("inner"):
            carrier = inject_context()
            trace_id = current_trace_id()
    spans = by_name(exporter)
    assert spans["inner"].parent.span_id == spans["outer"].context.span_id
    assert carrier["traceparent"].split("-")[1] == trace_id == format(outer.get_span_context().trace_id, "032x")
    assert spans["outer"].resource.attributes["service.name"] == "pdserve-test"
    assert spans["outer"].resource.attributes["pdserve.role"] == "test"


def test_a_remote_parent_is_adopted(exporter):
    from shared.tracing import attach_context, detach_context
    token = attach_context(extract_context({"traceparent": CLIENT_PARENT}))
    try:
        with span("child"):
            assert current_trace_id() == TRACE_ID
    finally:
        detach_context(token)
    [child] = exporter.get_finished_spans()
    assert format(child.parent.span_id, "016x") == "00f067aa0ba902b7"


def test_a_failure_is_an_event_with_its_grpc_status(exporter):
    with span("call") as call:
        record_failure(call, "RESOURCE_EXHAUSTED", "no room", **{"pdserve.failure": "capacity"})
    [finished] = exporter.get_finished_spans()
    [event] = finished.events
    assert event.name == "failure"
    assert event.attributes["rpc.grpc.status_code"] == "RESOURCE_EXHAUSTED"
    assert event.attributes["pdserve.failure"] == "capacity"
    assert finished.status.status_code.name == "ERROR"


def test_log_lines_inside_a_traced_request_carry_its_trace_id(exporter):
    stream = io.StringIO()
    configure_logging("INFO", "json", {"role": "test"}, stream=stream)
    try:
        logger = logging.getLogger("tests.tracing")
        with span("request"):
            trace_id = current_trace_id()
            logger.info("inside")
        logger.info("outside")
    finally:
        configure_logging("INFO", "text")
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert inside["trace_id"] == trace_id
    assert "trace_id" not in outside


def test_a_line_naming_a_traced_request_carries_its_trace_id_outside_the_request_context(exporter):
    """The engine thread's observers and the engine-core process serve every request at once:
    their lines name the request (`extra`), and the trace id remembered for it comes along."""
    stream = io.StringIO()
    configure_logging("INFO", "json", {"role": "test"}, stream=stream)
    try:
        logger = logging.getLogger("tests.tracing")
        with span("rpc"):
            rpc_trace_id = current_trace_id()
            token = bind_request_id("req-1")  # what every RPC handler does
            current_request_id_var().reset(token)
        logger.info("finished", extra={"request_id": "req-1"})  # e.g. the engine thread's observer
        logger.info("untraced", extra={"request_id": "req-2"})
        RequestSpans().on_arrival("req-3", {"traceparent": CLIENT_PARENT}, "generate")  # in the core process
        logger.warning("core", extra={"request_id": "req-3#1"})  # completion 1 of n
    finally:
        configure_logging("INFO", "text")
    finished, untraced, core = (json.loads(line) for line in stream.getvalue().splitlines())
    assert finished["trace_id"] == rpc_trace_id and "trace_id" not in untraced
    assert core["trace_id"] == TRACE_ID


def test_a_child_process_traces_as_its_parent(exporter):
    assert json.loads(os.environ[CHILD_TRACING_ENV_VAR])["attributes"] == {"pdserve.role": "test"}
    shutdown_tracing()
    os.environ[CHILD_TRACING_ENV_VAR] = json.dumps({"endpoint": "http://127.0.0.1:1", "sample_ratio": 1.0,
                                                    "attributes": {"pdserve.role": "decode"}})
    assert configure_child_tracing("pdserve-engine-core")
    assert is_enabled()
    shutdown_tracing()
    os.environ[CHILD_TRACING_ENV_VAR] = "{not json"
    assert not configure_child_tracing("pdserve-engine-core")


def test_sampling_ratio_zero_records_nothing_but_keeps_trace_ids(monkeypatch):
    memory = InMemorySpanExporter()
    configure_tracing(TracingConfig(sample_ratio=0.0), "pdserve-test", exporter=memory)
    try:
        with span("unsampled"):
            assert current_trace_id() is not None
            flags = int(inject_context()["traceparent"].rsplit("-", 1)[1], 16)
            assert flags & 0x01 == 0  # not sampled, and passed on as such
    finally:
        shutdown_tracing()
        os.environ.pop(CHILD_TRACING_ENV_VAR, None)
    assert memory.get_finished_spans() == ()


# ---- gRPC: the interceptors on a real loopback server ------------------------------------

def _echo_handlers():
    async def unary(request: bytes, context) -> bytes:
        return (inject_context() or {}).get("traceparent", "").encode()

    async def streamed(request: bytes, context):
        yield (inject_context() or {}).get("traceparent", "").encode()
        if request == b"fail":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the KV has not arrived")

    return grpc.method_handlers_generic_handler("test.Echo", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.unary_stream_rpc_method_handler(streamed),
    })


async def _call_both(address: str, fail: bool):
    async with grpc.aio.insecure_channel(address, interceptors=client_interceptors()) as channel:
        unary = channel.unary_unary("/test.Echo/Unary")
        stream = channel.unary_stream("/test.Echo/Stream")
        with span("client"):
            client_trace_id = current_trace_id()
            unary_call = unary(b"")
            await unary_call
            unary_trailer = dict(await unary_call.trailing_metadata())
            stream_call = stream(b"fail" if fail else b"")
            code = grpc.StatusCode.OK
            try:
                async for _ in stream_call:
                    pass
            except grpc.aio.AioRpcError as error:
                code = error.code()
            stream_trailer = dict(await stream_call.trailing_metadata())
    return client_trace_id, unary_trailer, stream_trailer, code


async def _serve_and_call(fail: bool):
    server = grpc.aio.server(interceptors=[TracingServerInterceptor()])
    server.add_generic_rpc_handlers((_echo_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        return await _call_both(f"127.0.0.1:{port}", fail)
    finally:
        await server.stop(None)


def test_grpc_calls_carry_the_context_and_answer_the_trace_id(exporter):
    client_trace_id, unary_trailer, stream_trailer, code = asyncio.run(_serve_and_call(fail=False))
    assert code == grpc.StatusCode.OK
    assert unary_trailer[TRACE_ID_METADATA] == stream_trailer[TRACE_ID_METADATA] == client_trace_id
    spans = exporter.get_finished_spans()
    client = next(s for s in spans if s.name == "client")
    servers = [s for s in spans if s.name.startswith("test.Echo/")]
    assert sorted(s.name for s in servers) == ["test.Echo/Stream", "test.Echo/Unary"]
    assert all(s.parent.span_id == client.context.span_id and s.kind.name == "SERVER" for s in servers)


def test_an_aborted_call_is_a_failure_event_with_its_status(exporter):
    client_trace_id, _, stream_trailer, code = asyncio.run(_serve_and_call(fail=True))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert stream_trailer[TRACE_ID_METADATA] == client_trace_id
    [server] = [s for s in exporter.get_finished_spans() if s.name == "test.Echo/Stream"]
    failure = next(event for event in server.events if event.name == "failure")
    assert failure.attributes["rpc.grpc.status_code"] == "FAILED_PRECONDITION"
    assert "KV has not arrived" in failure.attributes["message"]
