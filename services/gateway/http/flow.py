"""From an InternalRequest to an HTTP response, through the gateway's one generation path.

`respond` opens the relay stream (`generate_stream` per prompt, merged as they arrive),
waits for its first message (so that failures before any token, e.g. no capacity, come back
as a proper HTTP status), then streams SSE or collects the whole JSON body. While it waits,
it watches the connection: a client that disconnects cancels the request.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from shared.pb.pdserve.v1 import gateway_pb2, generation_pb2

from services.gateway.errors import GatewayError
from services.gateway.fanout import merge_streams
from services.gateway.generation import generate_stream
from services.gateway.state import GatewayState
from services.gateway.http.builder import ResponseBuilder
from services.gateway.http.errors import gateway_error_response
from services.gateway.http.sse import EventStreamResponse, Tagged, sse_events
from services.gateway.http.to_internal import InternalRequest

logger = logging.getLogger(__name__)

T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away" (never seen by it)
# What a request's prompts are generated through: (HTTP request, one GenerateRequest per prompt,
# is_prompt_only) -> their merged, tagged stream. The gateway's relays them over the cluster
# (gateway_streams); an instance's OpenAI door has its own (services.instance.pod_streams).
StreamOpener = Callable[[Request, list[gateway_pb2.GenerateRequest], bool], AsyncIterator[Tagged]]


class ClientDisconnected(Exception):
    """The HTTP client closed the connection before its response was ready."""


async def respond(request: Request, state: GatewayState, internal: InternalRequest,
                  builder: ResponseBuilder, streams: StreamOpener | None = None) -> Response:
    """`streams`: the gateway's (gateway_streams) when None."""
    stream = (streams or gateway_streams(state))(request, internal.messages, internal.is_echo_only)
    is_handed_over = False
    try:
        if not internal.stream:
            return JSONResponse(await cancel_on_disconnect(request, _collect(stream, builder)))
        first = await cancel_on_disconnect(request, anext(stream))
        is_handed_over = True
        return EventStreamResponse(sse_events(first, stream, builder, internal.renamed))
    except GatewayError as error:
        return gateway_error_response(error, internal.renamed)
    except ClientDisconnected:
        logger.info("request %s: the HTTP client disconnected", builder.response_id)
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    finally:
        if not is_handed_over:
            await stream.aclose()


def gateway_streams(state: GatewayState) -> StreamOpener:
    """The gateway's StreamOpener: open_stream (the HTTP request's headers play no part)."""
    return lambda request, messages, is_prompt_only: open_stream(state, messages, is_prompt_only)


def open_stream(state: GatewayState, messages: list[gateway_pb2.GenerateRequest],
                is_prompt_only: bool = False) -> AsyncIterator[Tagged]:
    """One relay stream per prompt, merged; items are (prompt index, message)."""
    return merge_tagged([generate_stream(state, message, is_prompt_only=is_prompt_only) for message in messages])


def merge_tagged(streams: list[AsyncIterator[generation_pb2.GenerateResponse]]) -> AsyncIterator[Tagged]:
    """The prompts' streams (in prompt order) merged as their messages arrive, each tagged."""
    tagged = [_tagged(index, stream) for index, stream in enumerate(streams)]
    return tagged[0] if len(tagged) == 1 else merge_streams(tagged)


async def _tagged(prompt_index: int, stream: AsyncIterator[generation_pb2.GenerateResponse]) -> AsyncIterator[Tagged]:
    async with contextlib.aclosing(stream):
        async for response in stream:
            yield prompt_index, response


async def _collect(stream: AsyncIterator[Tagged], builder: ResponseBuilder) -> dict:
    async for prompt_index, message in stream:
        builder.add(prompt_index, message)
    return builder.response()


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, unless the client disconnects first: then `work` is cancelled and
    ClientDisconnected raised. (The request body must have been read already.)"""
    work_task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({work_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is shutting down: stop the work, then go
        work_task.cancel()
        watcher.cancel()
        await asyncio.gather(work_task, watcher, return_exceptions=True)
        raise
    watcher.cancel()
    if work_task not in done:
        work_task.cancel()
        await asyncio.gather(work_task, return_exceptions=True)
        raise ClientDisconnected()
    return work_task.result()


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
