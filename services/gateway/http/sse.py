"""Server-sent events: `data: {json}\\n\\n` per chunk, then `data: [DONE]\\n\\n`.

`EventStreamResponse` watches the connection while it streams: when the client disconnects,
the stream is cancelled at once (even while it waits for a token) and closed, so the relay
cancels its downstream calls and the instances free the request's blocks. An error after the
stream has started is sent as one `data: {"error": ...}` event before `[DONE]`, which the
openai client raises as an APIError.
"""

import contextlib
import json
from collections.abc import AsyncIterator, Mapping

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from shared.pb.pdserve.v1 import generation_pb2

from services.gateway.errors import GatewayError
from services.gateway.http.builder import ResponseBuilder
from services.gateway.http.errors import from_gateway_error

DONE_EVENT = "data: [DONE]\n\n"
Tagged = tuple[int, generation_pb2.GenerateResponse]  # (prompt index, message)


def encode_event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def sse_events(first: Tagged, rest: AsyncIterator[Tagged], builder: ResponseBuilder,
                     renamed: Mapping[str, str]) -> AsyncIterator[str]:
    """The whole event stream of one response, `first` being the relay's first message."""
    async with contextlib.aclosing(rest):
        try:
            for chunk in builder.opening_chunks():
                yield encode_event(chunk)
            for chunk in builder.chunks(*first):
                yield encode_event(chunk)
            async for prompt_index, message in rest:
                for chunk in builder.chunks(prompt_index, message):
                    yield encode_event(chunk)
            for chunk in builder.closing_chunks():
                yield encode_event(chunk)
            if builder.include_usage:
                yield encode_event(builder.usage_chunk())
        except GatewayError as error:
            yield encode_event(from_gateway_error(error, renamed).body())
    yield DONE_EVENT


class EventStreamResponse(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str]):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._stream_then_stop, send, group.cancel_scope)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()

    async def _stream_then_stop(self, send: Send, scope: anyio.CancelScope) -> None:
        try:
            await self.stream_response(send)
        except OSError:  # the client went away mid-write
            pass
        scope.cancel()
