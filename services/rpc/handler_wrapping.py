"""Wrap a grpc.aio method handler with code that runs before (and after) its behaviour.

Server interceptors use this to check a call (its request or metadata) before the servicer
sees it, e.g. to refuse a malformed message or a missing API key with a status of their
own. `before(request, context)` may abort; `after()` runs however the call ends. For
request-streaming methods `before` gets None for the request.
"""

import inspect
from collections.abc import Awaitable, Callable

import grpc

Before = Callable[[object, grpc.aio.ServicerContext], Awaitable[None]]
_BEHAVIOURS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def wrap_handler(handler: grpc.RpcMethodHandler, before: Before,
                 after: Callable[[], None] | None = None) -> grpc.RpcMethodHandler:
    changes = {}
    for name in _BEHAVIOURS:
        behaviour = getattr(handler, name, None)
        if behaviour is not None:
            request_streaming = name.startswith("stream")
            changes[name] = _wrapped(behaviour, before, after or _nothing, request_streaming)
    return handler._replace(**changes)


def _nothing() -> None:
    return None


def _wrapped(behaviour, before: Before, after: Callable[[], None], request_streaming: bool):
    if inspect.isasyncgenfunction(behaviour):
        async def streamed(request, context):
            try:
                await before(None if request_streaming else request, context)
                async for response in behaviour(request, context):
                    yield response
            finally:
                after()
        return streamed

    async def answered(request, context):
        try:
            await before(None if request_streaming else request, context)
            return await behaviour(request, context)
        finally:
            after()
    return answered
