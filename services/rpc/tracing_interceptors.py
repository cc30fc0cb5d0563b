"""gRPC and tracing: the server side runs each RPC in a SERVER span whose parent is the
caller's W3C `traceparent` (metadata), and answers the trace id as trailing metadata
`x-trace-id`; the client side puts the current span's `traceparent`/`tracestate` on every
outgoing call. Both exist only while tracing is on (`server_interceptors()` and
`client_interceptors()` are empty otherwise), so an untraced process pays nothing."""

import asyncio
import contextlib
import inspect

import grpc

from shared.tracing import (attach_context, current_trace_id, detach_context, extract_context, inject_context,
                            is_enabled, record_failure, span)

TRACE_ID_METADATA = "x-trace-id"
PROPAGATED_KEYS = ("traceparent", "tracestate")
# Load balancers and the gateway probe health often; those calls are no request's work.
UNTRACED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_BEHAVIOURS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    return [TracingServerInterceptor()] if is_enabled() else []


def client_interceptors() -> list:
    return [TracingUnaryUnaryInterceptor(), TracingUnaryStreamInterceptor()] if is_enabled() else []


class TracingServerInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(UNTRACED_PREFIXES):
            return handler
        carrier = {key: value for key, value in handler_call_details.invocation_metadata or ()
                   if key in PROPAGATED_KEYS and isinstance(value, str)}
        changes = {name: _traced(behaviour, method, carrier) for name in _BEHAVIOURS
                   if (behaviour := getattr(handler, name, None)) is not None}
        return handler._replace(**changes)


def _attributes(method: str) -> dict[str, str]:
    service, _, name = method.lstrip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


def _traced(behaviour, method: str, carrier: dict[str, str]):
    if inspect.isasyncgenfunction(behaviour):
        async def streamed(request, context):
            with _server_span(method, carrier, context):
                async for response in behaviour(request, context):
                    yield response
        return streamed

    async def answered(request, context):
        with _server_span(method, carrier, context):
            return await behaviour(request, context)
    return answered


@contextlib.contextmanager
def _server_span(method: str, carrier: dict[str, str], context: grpc.aio.ServicerContext):
    """The RPC's SERVER span, a child of the caller's context, with its trace id answered
    as trailing metadata and the way it ended (a failure's status, or a cancel) noted."""
    token = attach_context(extract_context(carrier))
    try:
        with span(method.lstrip("/"), _attributes(method), kind="server") as server_span:
            _answer_trace_id(context)
            try:
                yield
            except BaseException as error:
                _note_end(server_span, context, error)
                raise
    finally:
        detach_context(token)


def _answer_trace_id(context: grpc.aio.ServicerContext) -> None:
    trace_id = current_trace_id()
    if trace_id is not None:
        context.set_trailing_metadata(((TRACE_ID_METADATA, trace_id),))


def _note_end(server_span, context: grpc.aio.ServicerContext, error: BaseException) -> None:
    """The status the call ends with, as a failure event (a client's cancel as its own event)."""
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        server_span.add_event("cancelled")
        return
    code = context.code() if hasattr(context, "code") else None
    details = context.details() if hasattr(context, "details") else None
    code_name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    record_failure(server_span, code_name, details or f"{type(error).__name__}: {error}")


def _with_trace_context(details):
    carrier = inject_context()
    if not carrier:
        return details
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    for key, value in carrier.items():
        metadata[key] = value
    return details._replace(metadata=metadata)


class TracingUnaryUnaryInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(_with_trace_context(client_call_details), request)


class TracingUnaryStreamInterceptor(grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(_with_trace_context(client_call_details), request)
