"""The streams a decode instance serves for a reservation: Decode (its KV came from a prefill
instance; the stream starts from that instance's first token) and PrefillLocally (the prompt
is computed on the decode instance itself: conditional disaggregation).

A failure of either is told apart by the decode instance's health: handed back by a drain, not
SERVING any more, or the reservation unknown there (NOT_FOUND: its engine core restarted and
forgot it) is DecodeLost (the caller moves the completion elsewhere); anything else is the
client's error. A stream that brings nothing for stall_timeout_s from an instance that then
leaves a health probe unanswered is DecodeLost too ("hung": services.gateway.stall_watch); its
call is cancelled, so the instance, when it resumes, aborts the request and frees its blocks.
PrefillLocally refused for lack of room (RESOURCE_EXHAUSTED before any token) is
LocalPrefillRefused: the reservation is still there for a prefill on the pool.
"""

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from shared.pb.pdserve.v1 import generation_pb2, instance_pb2
from shared.wire.handback import is_handed_back

from services.gateway.deadline import Deadline
from services.gateway.errors import from_rpc_error
from services.gateway.first_token import RelayedToken, strip
from services.gateway.migration import fix_usage
from services.gateway.relay_context import RelayContext, is_failover
from services.gateway.request_prep import SubRequest
from services.gateway.reservations import (
    DecodeLost, Reservation, check_decode_alive, raise_if_decode_hung, release_unanswered,
)
from services.gateway.stall_watch import watched

logger = logging.getLogger(__name__)


class LocalPrefillRefused(Exception):
    """The decode instance has no room for a local prefill now; the reservation stands."""


@dataclass
class DecodeStart:
    """What Decode starts from: the prefill's answer, and the token the client has already."""

    first_token_id: int
    first_logprobs: generation_pb2.PositionLogprobs | None
    num_cached_prompt_tokens: int  # by the prefill instance, for the usage
    relayed: RelayedToken | None = None  # sent to the client already: kept out of the stream
    prompt_logprobs: list = field(default_factory=list)  # not sent yet: on the first message


async def decode_stream(ctx: RelayContext, sub: SubRequest, reservation: Reservation, start: DecodeStart,
                        deadline: Deadline) -> AsyncIterator[generation_pb2.GenerateResponse]:
    request = instance_pb2.DecodeRequest(request_id=sub.request_id, first_token_id=start.first_token_id)
    if start.first_logprobs is not None:
        request.first_logprobs.CopyFrom(start.first_logprobs)
    call = ctx.channels.stub(reservation.decode.grpc_address).Decode(request, timeout=deadline.remaining())
    is_first = True
    try:
        async for message in watched(ctx, call, lambda: raise_if_decode_hung(ctx, reservation)):
            if is_first:
                is_first = False
                if start.relayed is not None:
                    message = strip(message, start.relayed)
                elif sub.params.prompt_logprobs is not None:
                    message.prompt_logprobs.extend(start.prompt_logprobs)
            if message is None:
                continue
            if message.HasField("usage"):
                message.usage.cached_prompt_tokens = start.num_cached_prompt_tokens
            fix_usage(sub, message)
            yield message
    except grpc.aio.AioRpcError as error:
        await _raise_stream_failure(ctx, reservation, "Decode", error)
    finally:
        if not call.done():
            call.cancel()


async def local_prefill_stream(ctx: RelayContext, sub: SubRequest, reservation: Reservation,
                               deadline: Deadline) -> AsyncIterator[generation_pb2.GenerateResponse]:
    """The completion from the decode instance, its prompt computed there."""
    call = ctx.channels.stub(reservation.decode.grpc_address).PrefillLocally(
        instance_pb2.LocalPrefillRequest(request_id=sub.request_id), timeout=deadline.remaining())
    has_streamed = is_refused = False
    try:
        async for message in watched(ctx, call, lambda: raise_if_decode_hung(ctx, reservation)):
            has_streamed = True
            fix_usage(sub, message)
            yield message
    except grpc.aio.AioRpcError as error:
        is_refused = not has_streamed and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        if is_refused:
            raise LocalPrefillRefused(error.details()) from error
        await _raise_stream_failure(ctx, reservation, "PrefillLocally", error)
    finally:
        if not call.done():
            call.cancel()
        if not has_streamed and not is_refused:  # it may never have reached the instance
            release_unanswered(ctx, reservation.decode, sub.request_id)


async def _raise_stream_failure(ctx: RelayContext, reservation: Reservation, method: str,
                                error: grpc.aio.AioRpcError) -> None:
    if error.code() == grpc.StatusCode.UNAVAILABLE and is_handed_back(error.trailing_metadata()):
        raise DecodeLost(reservation.decode, error.details(), "drain") from error
    if error.code() == grpc.StatusCode.NOT_FOUND:  # it lost the reservation: its engine core restarted
        raise DecodeLost(reservation.decode, error.details(), "failure") from error
    if is_failover(error):
        await check_decode_alive(ctx, reservation, f"{method} failed ({error.code().name})")
    raise from_rpc_error(error, f"decode instance {reservation.decode.instance_id}") from error
