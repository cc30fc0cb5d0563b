"""AccessInterceptor: API keys and per-key rate limits on the gateway's gRPC port.

The key travels as metadata `authorization: Bearer <key>`. The health service stays open
(load balancers probe it); every other method needs a valid key when keys are configured.
Refusals: UNAUTHENTICATED, or RESOURCE_EXHAUSTED with trailing metadata `retry-after`
(whole seconds).
"""

import grpc

from services.rpc.handler_wrapping import wrap_handler
from services.gateway.access import AccessControl, AccessDenied
from services.gateway.rate_limits import retry_after_header

OPEN_SERVICE_PREFIXES = ("/grpc.health.v1.Health/",)


class AccessInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, access: AccessControl):
        self.access = access

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_SERVICE_PREFIXES):
            return handler
        authorization = _metadata_value(handler_call_details.invocation_metadata, "authorization")
        admitted: list[str] = []

        async def admit(request, context) -> None:
            try:
                admitted.append(self.access.admit(authorization))
            except AccessDenied as denied:
                if denied.retry_after_s is not None:
                    context.set_trailing_metadata((("retry-after", retry_after_header(denied.retry_after_s)),))
                await context.abort(denied.code, denied.message)

        def release() -> None:
            for key_id in admitted:
                self.access.release(key_id)

        return wrap_handler(handler, admit, release)


def _metadata_value(metadata, name: str) -> str | None:
    for key, value in metadata or ():
        if key == name and isinstance(value, str):
            return value
    return None
