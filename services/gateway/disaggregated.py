"""One completion through the disaggregated path: Reserve on a decode instance, Prefill on a
prefill instance (retried on others when one fails), then relay the Decode stream.

While the prompt waits for or runs on a prefill instance, the reservation's lease is renewed
every third of its length, so a queue longer than the lease costs no request. Whatever happens
before Decode starts (failure, client cancel, deadline), the reservation is given back with
Release in the background; once Decode runs, cancelling its call is enough.

A decode instance that dies (or drains away) is told apart from a failing prefill instance by
its health check: the gateway then reserves on another decode instance and runs the prefill
again toward it, and only the lost decode instance is marked suspect. When the client already
has some of the completion's tokens, the new attempt continues after them (migration.py).
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2

from shared.pb.pdserve.v1 import generation_pb2, instance_pb2
from shared.wire.handback import is_handed_back

from services.gateway.deadline import Deadline
from services.gateway.errors import GatewayError, from_rpc_error, no_capacity
from services.gateway.migration import continuation, final_message, fix_usage, is_complete
from services.gateway.peer_source import add_peer_source
from services.gateway.relay_context import CONTROL_CALL_TIMEOUT_S, RelayContext, is_failover
from services.gateway.request_prep import SubRequest
from services.gateway.router import Candidate, no_pair_reason, pairable_decodes, prefills_for, rank

logger = logging.getLogger(__name__)

# A Reserve that failed this way may have been granted without the answer reaching us.
UNANSWERED_CODES = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                              grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN})


# How long a health check may take to tell a dead decode instance from a failed prefill.
HEALTH_PROBE_TIMEOUT_S = 1.0
SERVING = health_pb2.HealthCheckResponse.SERVING


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
        self.reason = reason  # "failure" (unreachable) or "drain" (answers NOT_SERVING)


async def reserve(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                  deadline: Deadline, excluded: Collection[str] = ()) -> Reservation:
    """The first decode instance (best first, none of `excluded`, only those some prefill
    instance can pair with) that grants a reservation."""
    choice = rank(pairable_decodes(candidates), "decode", excluded=excluded)
    ctx.stats.record_route("decode", choice.reason)
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
    num_refused = 0
    for decode in choice.ranked:
        try:
            reply = await ctx.channels.stub(decode.grpc_address).Reserve(
                message, timeout=deadline.remaining(CONTROL_CALL_TIMEOUT_S))
            return Reservation(decode, reply)
        except asyncio.CancelledError:
            _release_unanswered(ctx, decode, sub.request_id)
            raise
        except grpc.aio.AioRpcError as error:
            if error.code() in UNANSWERED_CODES:
                _release_unanswered(ctx, decode, sub.request_id)
            num_refused += _note_reserve_failure(ctx, sub, decode, error)
    if num_refused:
        raise no_capacity(num_refused)
    raise GatewayError(grpc.StatusCode.UNAVAILABLE,
                       f"none of the {len(choice.ranked)} decode instances could be reached")


def _release_unanswered(ctx: RelayContext, decode: Candidate, request_id: str) -> None:
    """A Reserve whose answer never came may still have been granted: release it now, in the
    background (NOT_FOUND is fine), rather than leave it to its lease."""
    ctx.spawn(release_at(ctx, decode, request_id, quiet=True), f"release-{request_id}")


def _note_reserve_failure(ctx: RelayContext, sub: SubRequest, decode: Candidate,
                          error: grpc.aio.AioRpcError) -> int:
    """1 if the instance refused for lack of room, 0 if it failed; raises for other errors."""
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


async def prefill(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                  reservation: Reservation | None, deadline: Deadline) -> instance_pb2.PrefillResponse:
    """Prefill on the best prefill instance; on failure, on the next one (up to the retries).
    Without a reservation the prompt is only scored: no KV is sent anywhere."""
    message = _prefill_message(sub, reservation)
    eligible = candidates if reservation is None else prefills_for(reservation.decode, candidates)
    failed: dict[str, str] = {}
    for attempt in range(1 + ctx.max_prefill_retries):
        choice = rank(eligible, "prefill", excluded=failed)
        if not choice.ranked:
            break
        ctx.stats.record_route("prefill", choice.reason if attempt == 0 else "retry")
        ctx.stats.num_prefill_retries += attempt > 0
        target = choice.ranked[0]
        add_peer_source(message, target, candidates)  # peer reuse: who holds more of the prompt
        try:
            return await ctx.channels.stub(target.grpc_address).Prefill(
                message, timeout=deadline.remaining())
        except grpc.aio.AioRpcError as error:
            if not is_failover(error):
                raise from_rpc_error(error, f"prefill instance {target.instance_id}") from error
            if reservation is not None:
                await _check_decode_alive(ctx, reservation, f"Prefill on {target.instance_id} failed "
                                                            f"({error.code().name})")
            failed[target.instance_id] = f"{error.code().name}: {error.details()}"
            ctx.view.mark_failed(target.instance_id)
            logger.warning("request %s: Prefill on %s failed (%s); retrying elsewhere",
                           sub.request_id, target.instance_id, error.code().name)
    if not failed and reservation is not None:
        raise GatewayError(grpc.StatusCode.UNAVAILABLE, f"no live prefill instance can pair with decode "
                                                        f"{reservation.decode.instance_id}")
    raise GatewayError(grpc.StatusCode.UNAVAILABLE,
                       f"prefill failed on every instance tried: {failed or 'none live'}")


async def _check_decode_alive(ctx: RelayContext, reservation: Reservation, why: str) -> None:
    """Raise DecodeLost unless the reservation's decode instance still answers SERVING."""
    status = await ctx.channels.health(reservation.decode.grpc_address, HEALTH_PROBE_TIMEOUT_S)
    if status != SERVING:
        raise DecodeLost(reservation.decode, why, "failure" if status is None else "drain")


def _prefill_message(sub: SubRequest, reservation: Reservation | None) -> instance_pb2.PrefillRequest:
    """None: no destination (prompt only, nothing sent). The blocks to skip are the decode
    instance's count (ReserveResponse.num_skip_blocks), never re-derived here."""
    message = instance_pb2.PrefillRequest(
        request_id=sub.request_id, prompt_token_ids=sub.prompt_token_ids, sampling=sub.sampling_proto())
    if sub.resumed_token_ids:
        message.num_resumed_output_tokens = len(sub.resumed_token_ids)
    if reservation is not None:
        reply = reservation.reply
        message.decode_ucx_address = reply.ucx_address
        message.dst_block_ids.extend(reply.block_ids)
        message.num_skip_blocks = reply.num_skip_blocks
        if reply.HasField("transfer_token"):
            message.transfer_token = reply.transfer_token
    if sub.parent.cache_salt:
        message.cache_salt = sub.parent.cache_salt
    return message


async def release(ctx: RelayContext, reservation: Reservation, request_id: str) -> None:
    """Give a reservation back (best effort; its lease frees it anyway)."""
    await release_at(ctx, reservation.decode, request_id)


async def release_at(ctx: RelayContext, decode: Candidate, request_id: str, quiet: bool = False) -> None:
    """Release `request_id` on `decode`; `quiet`: it may not exist (a Reserve left unanswered)."""
    ctx.stats.num_releases += 1
    try:
        await ctx.channels.stub(decode.grpc_address).Release(
            instance_pb2.ReleaseRequest(request_id=request_id), timeout=CONTROL_CALL_TIMEOUT_S)
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
            await stub.Renew(message, timeout=CONTROL_CALL_TIMEOUT_S)
            ctx.stats.num_lease_renewals += 1
        except grpc.aio.AioRpcError as error:
            logger.warning("request %s: Renew on %s failed (%s: %s)", request_id, reservation.decode.instance_id,
                           error.code().name, error.details())


async def prefill_under_lease(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                              reservation: Reservation, deadline: Deadline) -> instance_pb2.PrefillResponse:
    renewer = asyncio.create_task(renew_until_cancelled(ctx, reservation, sub.request_id))
    try:
        return await prefill(ctx, sub, candidates, reservation, deadline)
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer


async def run_disaggregated(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                            deadline: Deadline) -> AsyncIterator[generation_pb2.GenerateResponse]:
    """Reserve -> Prefill -> Decode, again on another decode instance whenever the one holding
    the reservation or running the stream is lost (continuing after the tokens already
    streamed); yields the decode instance's messages."""
    lost: dict[str, str] = {}
    streamed: list[int] = []
    while True:
        attempt = continuation(sub, streamed) if streamed else sub
        reservation = await reserve(ctx, attempt, candidates, deadline, excluded=lost)
        try:
            async for message in _prefill_then_decode(ctx, attempt, candidates, reservation, deadline):
                streamed.extend(message.token_ids)
                yield message
            return
        except DecodeLost as loss:
            _note_loss(ctx, sub, loss, lost, len(streamed))
            candidates = await ctx.view.candidates(sub.parent.hashes)  # restarts, new ones
        if is_complete(sub, streamed):
            yield final_message(sub, streamed)
            return


def _note_loss(ctx: RelayContext, sub: SubRequest, loss: DecodeLost, lost: dict[str, str],
               num_streamed: int) -> None:
    lost[loss.decode.instance_id] = loss.why
    ctx.view.mark_failed(loss.decode.instance_id)
    ctx.stats.num_decode_failovers += 1
    if num_streamed:
        ctx.stats.migrations[loss.reason] += 1
    logger.warning("request %s: %s; %s on another decode instance", sub.request_id, loss,
                   f"migrating after {num_streamed} tokens" if num_streamed else "reserving")


async def _prefill_then_decode(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                               reservation: Reservation,
                               deadline: Deadline) -> AsyncIterator[generation_pb2.GenerateResponse]:
    decode_started = False
    try:
        first = await prefill_under_lease(ctx, sub, candidates, reservation, deadline)
        decode_started = True
        async for message in _decode_stream(ctx, sub, reservation, first, deadline):
            yield message
    finally:
        if not decode_started:
            ctx.spawn(release(ctx, reservation, sub.request_id), f"release-{sub.request_id}")


async def _decode_stream(ctx: RelayContext, sub: SubRequest, reservation: Reservation,
                         first: instance_pb2.PrefillResponse,
                         deadline: Deadline) -> AsyncIterator[generation_pb2.GenerateResponse]:
    request = instance_pb2.DecodeRequest(request_id=sub.request_id,
                                         first_token_id=first.first_token_id)
    if first.HasField("first_logprobs"):
        request.first_logprobs.CopyFrom(first.first_logprobs)
    call = ctx.channels.stub(reservation.decode.grpc_address).Decode(
        request, timeout=deadline.remaining())
    is_first = True
    try:
        async for message in call:
            if is_first and sub.params.prompt_logprobs is not None:
                message.prompt_logprobs.extend(first.prompt_logprobs)
            is_first = False
            if message.HasField("usage"):
                message.usage.cached_prompt_tokens = first.num_cached_prompt_tokens
            fix_usage(sub, message)
            yield message
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.UNAVAILABLE and is_handed_back(error.details()):
            raise DecodeLost(reservation.decode, error.details(), "drain") from error
        if is_failover(error):
            await _check_decode_alive(ctx, reservation, f"Decode failed ({error.code().name})")
        raise from_rpc_error(error, f"decode instance {reservation.decode.instance_id}") from error
    finally:
        if not call.done():
            call.cancel()
