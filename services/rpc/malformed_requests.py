"""MalformedRequestInterceptor: requests that never arrive whole, or whose bytes are not a
valid protobuf message of the method's type, get a status at once instead of a hang or a
traceback.

grpc on its own answers undecodable bytes with UNKNOWN and an error-level traceback, and
never answers a unary call whose client half-closes without a message (or stalls mid-message)
until the client's deadline. The interceptor serves each unary-request method as a
request-streaming one so that it reads the request itself:
  * bytes that do not parse  -> INVALID_ARGUMENT, one info log line; when a string field
    holds invalid UTF-8, the message names the field's full path
    (`chat.messages[2].content: not valid UTF-8 text`; services.rpc.utf8_fields);
  * no message at all        -> INVALID_ARGUMENT;
  * no whole message within `read_timeout_s` -> DEADLINE_EXCEEDED.
Then it calls the method's own behaviour with the parsed request.
"""

import asyncio
import inspect
import logging
from dataclasses import dataclass

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor

from services.rpc.utf8_fields import invalid_utf8_field

logger = logging.getLogger(__name__)

DEFAULT_READ_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class MalformedMessage:
    reason: str
    invalid_utf8_field: str | None = None  # the full path of a string field that is not UTF-8


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S):
        self.read_timeout_s = read_timeout_s

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        reader = _RequestReader(handler_call_details.method, self.read_timeout_s)
        deserializer = _never_raising(handler.request_deserializer, _request_type(handler_call_details.method))
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                reader.streamed(handler.unary_stream), deserializer, handler.response_serializer)
        return grpc.stream_unary_rpc_method_handler(
            reader.answered(handler.unary_unary), deserializer, handler.response_serializer)


class _RequestReader:
    def __init__(self, method: str, read_timeout_s: float):
        self.method = method
        self.read_timeout_s = read_timeout_s

    async def read(self, context: grpc.aio.ServicerContext):
        try:
            request = await asyncio.wait_for(context.read(), self.read_timeout_s)
        except asyncio.TimeoutError:
            await self._refuse(context, grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"request: no whole request message within {self.read_timeout_s:g} s")
        if request is grpc.aio.EOF:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "request: the call carried no request message")
        if isinstance(request, MalformedMessage):
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, self._why_malformed(request))
        return request

    def _why_malformed(self, request: MalformedMessage) -> str:
        if request.invalid_utf8_field is not None:
            return f"{request.invalid_utf8_field}: not valid UTF-8 text"
        return f"request: not a valid protobuf message for {self.method} ({request.reason})"

    async def _refuse(self, context, code: grpc.StatusCode, message: str) -> None:
        logger.info("%s: request refused: %s", self.method, message)
        await context.abort(code, message)

    def streamed(self, behaviour):
        if not inspect.isasyncgenfunction(behaviour):
            async def written(request_iterator, context):
                await behaviour(await self.read(context), context)
            return written

        async def streamed(request_iterator, context):
            async for response in behaviour(await self.read(context), context):
                yield response
        return streamed

    def answered(self, behaviour):
        async def answered(request_iterator, context):
            return await behaviour(await self.read(context), context)
        return answered


def _request_type(method: str) -> Descriptor | None:
    """The request message type of `/package.Service/Method`, if its descriptor is loaded."""
    try:
        return descriptor_pool.Default().FindMethodByName(method.strip("/").replace("/", ".")).input_type
    except KeyError:
        return None


def _never_raising(deserializer, request_type: Descriptor | None):
    def deserialize(data: bytes):
        try:
            return deserializer(data)
        except Exception as error:  # noqa: BLE001 - any parse failure is the client's
            field = invalid_utf8_field(request_type, data) if request_type is not None else None
            return MalformedMessage(f"{type(error).__name__}: {str(error)[:200]}", field)
    return deserialize
