"""Reservations on decode instances: Reserve (best instance first, refusals and failures
noted), Release (in the background when the answer may have been lost), lease renewal while
the prompt waits for or runs on a prefill instance, and the health check that tells a lost
decode instance (DecodeLost) from a failed prefill instance."""

import asyncio
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2

from shared.pb.pdserve.v1 import instance_pb2
from shared.tracing import add_event, span

from services.gateway.deadline import Deadline
from services.gateway.errors import GatewayError, from_rpc_error, no_capacity
from services.gateway.relay_context import RelayContext, is_failover
from services.gateway.request_prep import SubRequest
from services.gateway.router import Candidate, no_pair_reason, pairable_decodes, rank
from services.gateway.stall_watch import is_unresponsive, note_hung

logger = logging.getLogger(__name__)

# A Reserve that failed this way may have been granted without the answer reaching us.
UNANSWERED_CODES = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                              grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN})

SERVING = health_pb2.HealthCheckResponse.SERVING

# Rounds of Reserve calls over the decode instances before a request fails for want of an
# answer. A second round, on a fresh listing, saves the request when every instance missed
# one answer and not for good: in an e2e fault run, with a prefill instance SIGSTOPped, both
# decode instances left the Reserves of the restarted completions unanswered for the whole
# control-call timeout once in about 20 runs, then answered again.
RESERVE_ROUNDS = 2


@dataclass
class Reservation:
    decode: Candidate
    reply: instance_pb2.ReserveResponse


class DecodeLost(Exception):
    """The decode instance holding the reservation (or running the stream) is gone."""

    def __init__(self, decode: Candidate, why: str, reason: str):
        super().__init__(f"decode instance {decode.instance_id} lost ({reason}): {why}")
        self.decode = decode
        self.why = why
        self.reason = reason  # "failure" (unreachable), "drain" (answers NOT_SERVING) or "hung" (stalled)


class NoDecodeAnswered(GatewayError):
    """Every decode instance tried failed or left its Reserve unanswered; none refused for room."""


class ReservationAbandoned(Exception):
    """The prefill instance sending into the reservation hung (services.gateway.stall_watch):
    its transfer may be stuck half-way, and the decode instance would refuse a second one into
    the same reservation. The reservation is given back, which withdraws the transfer (a late
    write of the hung sender is refused), and the completion starts over on a fresh one."""


class NoRoom(GatewayError):
    """Every decode instance that answered refused the Reserve for want of free KV blocks."""


async def reserve(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                  deadline: Deadline, excluded: Collection[str] = ()) -> Reservation:
    """The first decode instance (best first, none of `excluded`, only those some prefill
    instance can pair with) that grants a reservation. When every one that answered refused
    for want of room, the request waits its turn for room (services.gateway.decode_room), at
    most ctx.max_room_wait_s and within its deadline; it joins that queue at once when others
    wait in it already."""
    room = ctx.room
    turn = room.join() if room.num_waiting and ctx.max_room_wait_s > 0 else None
    waited_since = time.monotonic()
    try:
        while True:
            if turn is not None:
                wait_s = min(deadline.seconds_left(), ctx.max_room_wait_s - (time.monotonic() - waited_since))
                if not await room.wait_turn(turn, wait_s):
                    raise _out_of_room_wait(ctx, time.monotonic() - waited_since)
                candidates = await ctx.view.candidates(sub.parent.hashes)
            try:
                return await _reserve_answered(ctx, sub, candidates, deadline, excluded)
            except NoRoom:
                if ctx.max_room_wait_s <= 0:
                    raise
                turn = turn or room.join()
    finally:
        if turn is not None:
            room.leave(turn)


def _out_of_room_wait(ctx: RelayContext, waited_s: float) -> GatewayError:
    return GatewayError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"no decode instance had free KV blocks for the request within the {waited_s:.1f} s it "
                        f"waited (max_room_wait_s={ctx.max_room_wait_s:g}, or its deadline); retry later or "
                        "with a shorter prompt or max_tokens")


async def _reserve_answered(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                            deadline: Deadline, excluded: Collection[str]) -> Reservation:
    """One round of Reserve calls; when no instance answered at all (each failed or left its
    Reserve unanswered; none refused for room), the instances are listed afresh and tried once
    more while the deadline allows (RESERVE_ROUNDS)."""
    for _ in range(RESERVE_ROUNDS - 1):
        try:
            return await _reserve_round(ctx, sub, candidates, deadline, excluded)
        except NoDecodeAnswered as unanswered:
            if deadline.has_passed():
                raise
            ctx.stats.num_reserve_rounds_repeated += 1
            logger.warning("request %s: %s; listing the instances again and trying once more", sub.request_id,
                           unanswered)
        candidates = await ctx.view.candidates(sub.parent.hashes)
    return await _reserve_round(ctx, sub, candidates, deadline, excluded)


async def _reserve_round(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                         deadline: Deadline, excluded: Collection[str]) -> Reservation:
    choice = rank(pairable_decodes(candidates), "decode", excluded=excluded)
    ctx.stats.record_route("decode", choice.reason)
    with span("gateway.reserve", {"pdserve.candidates": [c.instance_id for c in choice.ranked],
                                  "pdserve.route_reason": choice.reason}) as reserve_span:
        reservation = await _reserve_on_first(ctx, sub, candidates, choice, deadline, excluded)
        reserve_span.set_attributes({"pdserve.decode_instance": reservation.decode.instance_id,
                                     "pdserve.num_blocks": len(reservation.reply.block_ids),
                                     "pdserve.num_cached_prompt_tokens": reservation.reply.num_cached_prompt_tokens})
        return reservation


async def _reserve_on_first(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate], choice,
                            deadline: Deadline, excluded: Collection[str]) -> Reservation:
    if not choice.ranked:
        remaining = [c for c in candidates if c.instance_id not in excluded]
        raise GatewayError(grpc.StatusCode.UNAVAILABLE, f"no decode instance to reserve on: "
                                                        f"{no_pair_reason(remaining)}")
    message = instance_pb2.ReserveRequest(
        request_id=sub.request_id, prompt_token_ids=sub.prompt_token_ids,
        sampling=sub.sampling_proto(), lease_ms=max(1, round(ctx.lease_s * 1000)))
    if sub.resumed_token_ids:
        message.num_resumed_output_tokens = len(sub.resumed_token_ids)
    if sub.parent.cache_salt:
        message.cache_salt = sub.parent.cache_salt
    if sub.parent.adapter is not None:
        message.lora_adapter.CopyFrom(sub.parent.adapter_ref())
    num_refused = 0
    for decode in choice.ranked:
        try:
            reply = await ctx.channels.stub(decode.grpc_address).Reserve(
                message, timeout=deadline.remaining(ctx.hang.control_call_s))
            return Reservation(decode, reply)
        except asyncio.CancelledError:
            release_unanswered(ctx, decode, sub.request_id)
            raise
        except grpc.aio.AioRpcError as error:
            if error.code() in UNANSWERED_CODES:
                release_unanswered(ctx, decode, sub.request_id)
            add_event("reserve_failed", {"pdserve.instance": decode.instance_id,
                                         "rpc.grpc.status_code": error.code().name,
                                         "message": (error.details() or "")[:300]})
            num_refused += _note_reserve_failure(ctx, sub, decode, error, deadline)
    if num_refused:
        raise no_capacity(num_refused, error_class=NoRoom)
    raise NoDecodeAnswered(grpc.StatusCode.UNAVAILABLE,
                           f"none of the {len(choice.ranked)} decode instances could be reached")


def release_unanswered(ctx: RelayContext, decode: Candidate, request_id: str) -> None:
    """A Reserve whose answer never came may still have been granted: release it now, in the
    background (NOT_FOUND is fine), rather than leave it to its lease."""
    ctx.spawn(release_at(ctx, decode, request_id, quiet=True), f"release-{request_id}")


def _note_reserve_failure(ctx: RelayContext, sub: SubRequest, decode: Candidate,
                          error: grpc.aio.AioRpcError, deadline: Deadline) -> int:
    """1 if the instance refused for lack of room, 0 if it failed or did not answer within
    control_call_timeout_s (hung); raises for other errors (the request's deadline passing too)."""
    if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and not deadline.has_passed():
        ctx.stats.num_decode_failovers += 1
        note_hung(ctx, decode)
        logger.warning("request %s: Reserve on %s got no answer in %g s (hung?); trying another", sub.request_id,
                       decode.instance_id, ctx.hang.control_call_s)
        return 0
    if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        ctx.stats.num_decode_refusals += 1
        logger.info("request %s: decode %s refused: %s", sub.request_id, decode.instance_id,
                    error.details())
        return 1
    if is_failover(error):
        ctx.stats.num_decode_failovers += 1
        ctx.view.mark_failed(decode.instance_id)
        logger.warning("request %s: Reserve on %s failed (%s); trying another", sub.request_id,
                       decode.instance_id, error.code().name)
        return 0
    raise from_rpc_error(error, f"decode instance {decode.instance_id}")


async def check_decode_alive(ctx: RelayContext, reservation: Reservation, why: str) -> None:
    """Raise DecodeLost unless the reservation's decode instance still answers SERVING."""
    status = await ctx.channels.health(reservation.decode.grpc_address, ctx.hang.health_probe_s)
    if status != SERVING:
        raise DecodeLost(reservation.decode, why, "failure" if status is None else "drain")


async def raise_if_decode_hung(ctx: RelayContext, reservation: Reservation) -> None:
    """DecodeLost ("hung") when the decode instance of a stalled stream does not answer a
    health probe (services.gateway.stall_watch)."""
    if await is_unresponsive(ctx, reservation.decode):
        note_hung(ctx, reservation.decode)
        raise DecodeLost(reservation.decode, f"no message for {ctx.hang.stall_s:g} s and no answer to a health "
                                             f"probe in {ctx.hang.health_probe_s:g} s", "hung")


async def release(ctx: RelayContext, reservation: Reservation, request_id: str) -> None:
    """Give a reservation back (best effort; its lease frees it anyway)."""
    await release_at(ctx, reservation.decode, request_id)


async def release_at(ctx: RelayContext, decode: Candidate, request_id: str, quiet: bool = False) -> None:
    """Release `request_id` on `decode`; `quiet`: it may not exist (a Reserve left unanswered)."""
    ctx.stats.num_releases += 1
    try:
        await ctx.channels.stub(decode.grpc_address).Release(
            instance_pb2.ReleaseRequest(request_id=request_id), timeout=ctx.hang.control_call_s)
    except grpc.aio.AioRpcError as error:
        if quiet and error.code() == grpc.StatusCode.NOT_FOUND:
            return
        logger.warning("request %s: Release on %s failed (%s); its lease will free it", request_id,
                       decode.instance_id, error.code().name)


async def renew_until_cancelled(ctx: RelayContext, reservation: Reservation, request_id: str) -> None:
    """Renew the lease every third of its length; the caller cancels this once prefill returns.
    A failed renewal is logged and retried next period (the lease may still be long enough)."""
    message = instance_pb2.RenewRequest(request_id=request_id, lease_ms=max(1, round(ctx.lease_s * 1000)))
    stub = ctx.channels.stub(reservation.decode.grpc_address)
    while True:
        await asyncio.sleep(ctx.lease_s / 3)
        try:
            await stub.Renew(message, timeout=ctx.hang.control_call_s)
            ctx.stats.num_lease_renewals += 1
        except grpc.aio.AioRpcError as error:
            logger.warning("request %s: Renew on %s failed (%s: %s)", request_id, reservation.decode.instance_id,
                           error.code().name, error.details())
