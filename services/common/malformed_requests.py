"""MalformedRequestInterceptor: a request whose bytes are not a valid protobuf message of
the method's type is refused with INVALID_ARGUMENT, logged on one info line (no traceback).

Without it grpc answers UNKNOWN and logs an error with a traceback for every such request.
The interceptor swaps each method's deserializer for one that never raises: it returns a
MalformedMessage, which the wrapped behaviour refuses before the servicer sees it.
"""

import logging
from dataclasses import dataclass

import grpc

from services.common.grpc_wrapping import wrap_handler

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MalformedMessage:
    reason: str


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method

        async def refuse_malformed(request, context) -> None:
            if isinstance(request, MalformedMessage):
                logger.info("%s: malformed request refused (%s)", method, request.reason)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"request: not a valid protobuf message for {method} ({request.reason})")

        wrapped = wrap_handler(handler, refuse_malformed)
        return wrapped._replace(request_deserializer=_never_raising(handler.request_deserializer))


def _never_raising(deserializer):
    def deserialize(data: bytes):
        try:
            return deserializer(data)
        except Exception as error:  # noqa: BLE001 - any parse failure is the client's
            return MalformedMessage(f"{type(error).__name__}: {str(error)[:200]}")
    return deserialize
