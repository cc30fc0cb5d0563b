"""TracingMiddleware (ASGI, installed only while tracing is on): each HTTP request runs in a
SERVER span whose parent is the client's W3C `traceparent` header (or starts a trace), and
the response carries the trace id in the `x-trace-id` header."""

from shared.tracing import attach_context, current_trace_id, detach_context, extract_context, record_failure, span

from services.rpc.tracing_interceptors import PROPAGATED_KEYS, TRACE_ID_METADATA

UNTRACED_PATHS = ("/health", "/metrics")
_PROPAGATED = tuple(key.encode() for key in PROPAGATED_KEYS)


class TracingMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in UNTRACED_PATHS:
            await self.app(scope, receive, send)
            return
        carrier = {key.decode(): value.decode("latin-1") for key, value in scope.get("headers", ())
                   if key in _PROPAGATED}
        token = attach_context(extract_context(carrier))
        try:
            name = f"{scope['method']} {scope['path']}"
            with span(name, {"http.request.method": scope["method"], "url.path": scope["path"]},
                      kind="server") as server_span:
                trace_id = current_trace_id()

                async def send_with_trace_id(message) -> None:
                    if message["type"] == "http.response.start":
                        status = message["status"]
                        server_span.set_attribute("http.response.status_code", status)
                        if status >= 400:
                            record_failure(server_span, f"HTTP_{status}", "the request failed")
                        if trace_id is not None:
                            message = {**message, "headers": [*message.get("headers", ()),
                                                              (TRACE_ID_METADATA.encode(), trace_id.encode())]}
                    await send(message)

                await self.app(scope, receive, send_with_trace_id)
        finally:
            detach_context(token)
