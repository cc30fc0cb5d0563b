"""StreamPrefill on the prefill pool: the best prefill instance first, the next one when it
fails (up to the retries), the reservation's lease renewed meanwhile.

A prefill stream that brings nothing for stall_timeout_s has its prefill instance and then its
decode instance probed (services.gateway.stall_watch): a hung decode instance is DecodeLost; a
hung prefill instance is ReservationAbandoned when it was sending into a reservation (the
caller starts over on a fresh one), else replaced like a failed one.

A retry ranks the instances of a fresh listing: the prompt may have waited in a queue while
instances left and joined, and one that joined meanwhile takes it rather than the request failing
on the instances it first had.

The events of each attempt are passed on as they come: the first token (as soon as the
prefill instance sampled it) and the outcome. An attempt that fails after its first token is
retried like any other; the caller keeps the first token it already relayed (a retry samples
its own, which the caller then ignores: services.gateway.disaggregated).
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc

from shared.pb.pdserve.v1 import instance_pb2
from shared.tracing import record_failure, span

from services.gateway.deadline import Deadline
from services.gateway.errors import GatewayError, from_rpc_error
from services.gateway.peer_source import add_peer_source
from services.gateway.relay_context import RelayContext, is_failover
from services.gateway.request_prep import SubRequest
from services.gateway.reservations import (
    Reservation, ReservationAbandoned, check_decode_alive, raise_if_decode_hung, renew_until_cancelled,
)
from services.gateway.router import Candidate, prefills_for, rank
from services.gateway.stall_watch import InstanceHung, raise_if_hung, watched

logger = logging.getLogger(__name__)


async def stream_prefill(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                         reservation: Reservation | None,
                         deadline: Deadline) -> AsyncIterator[instance_pb2.PrefillEvent]:
    """Prefill events from the best prefill instance, or from the next after a failure.
    Without a reservation the prompt is only scored: no KV is sent anywhere. Raises
    DecodeLost when a failure turns out to be the decode instance's."""
    message = prefill_message(sub, reservation)
    failed: dict[str, str] = {}
    for attempt in range(1 + ctx.max_prefill_retries):
        if attempt > 0:  # the prompt may have waited long: instances left and joined meanwhile
            candidates = await ctx.view.candidates(sub.parent.hashes)
        eligible = candidates if reservation is None else prefills_for(reservation.decode, candidates)
        choice = rank(eligible, "prefill", excluded=failed)
        if not choice.ranked:
            break
        ctx.stats.record_route("prefill", choice.reason if attempt == 0 else "retry")
        ctx.stats.num_prefill_retries += attempt > 0
        target = choice.ranked[0]
        if sub.parent.adapter is None:  # peers send base-model prefixes only
            add_peer_source(message, target, candidates)  # peer reuse: who holds more of the prompt
        with span("gateway.prefill", {"pdserve.prefill_instance": target.instance_id, "pdserve.attempt": attempt,
                                      "pdserve.route_reason": choice.reason if attempt == 0 else "retry",
                                      "pdserve.candidates": [c.instance_id for c in choice.ranked]},
                  kind="client") as attempt_span:
            call = ctx.channels.stub(target.grpc_address).StreamPrefill(message, timeout=deadline.remaining())
            try:
                async for event in watched(ctx, call, _hang_check(ctx, target, reservation)):
                    if event.HasField("done"):
                        attempt_span.set_attributes(_outcome_attributes(event.done))
                    else:
                        attempt_span.add_event("first_token")
                    yield event
                return
            except grpc.aio.AioRpcError as error:
                record_failure(attempt_span, error.code().name, error.details() or "")
                await _note_failure(ctx, sub, reservation, target, error, failed)
            except InstanceHung as hung:
                record_failure(attempt_span, "DEADLINE_EXCEEDED", str(hung))
                if reservation is not None:
                    raise ReservationAbandoned(str(hung)) from hung
                failed[target.instance_id] = str(hung)
                logger.warning("request %s: %s; retrying elsewhere", sub.request_id, hung)
            finally:
                if not call.done():
                    call.cancel()
    if not failed and reservation is not None:
        raise GatewayError(grpc.StatusCode.UNAVAILABLE, f"no live prefill instance can pair with decode "
                                                        f"{reservation.decode.instance_id}")
    raise GatewayError(grpc.StatusCode.UNAVAILABLE,
                       f"prefill failed on every instance tried: {failed or 'none live'}")


def _hang_check(ctx: RelayContext, target: Candidate, reservation: Reservation | None):
    """What a stalled StreamPrefill probes: the prefill instance (InstanceHung: the next one is
    tried), then the decode instance its KV goes to (DecodeLost: a stopped receiver stalls
    the transfer, and with it the prefill)."""
    async def check() -> None:
        await raise_if_hung(ctx, target)
        if reservation is not None:
            await raise_if_decode_hung(ctx, reservation)
    return check


def _outcome_attributes(done: instance_pb2.PrefillResponse) -> dict[str, int | float]:
    return {"pdserve.num_computed_prompt_tokens": done.num_computed_prompt_tokens,
            "pdserve.num_cached_prompt_tokens": done.num_cached_prompt_tokens,
            "pdserve.kv_bytes": done.kv_bytes_sent, "pdserve.kv_transfer_seconds": done.kv_transfer_seconds}


async def _note_failure(ctx: RelayContext, sub: SubRequest, reservation: Reservation | None, target: Candidate,
                        error: grpc.aio.AioRpcError, failed: dict[str, str]) -> None:
    """Record a failed attempt (the next instance is tried); raise when it is no instance's
    failure (the request's own) or the decode instance's (DecodeLost)."""
    if not is_failover(error):
        raise from_rpc_error(error, f"prefill instance {target.instance_id}") from error
    if reservation is not None:
        await check_decode_alive(ctx, reservation, f"Prefill on {target.instance_id} failed ({error.code().name})")
    failed[target.instance_id] = f"{error.code().name}: {error.details()}"
    ctx.view.mark_failed(target.instance_id)
    logger.warning("request %s: Prefill on %s failed (%s); retrying elsewhere", sub.request_id,
                   target.instance_id, error.code().name)


async def stream_prefill_under_lease(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                                     reservation: Reservation,
                                     deadline: Deadline) -> AsyncIterator[instance_pb2.PrefillEvent]:
    """stream_prefill, the reservation's lease renewed until it ends."""
    renewer = asyncio.create_task(renew_until_cancelled(ctx, reservation, sub.request_id))
    try:
        async with contextlib.aclosing(stream_prefill(ctx, sub, candidates, reservation, deadline)) as events:
            async for event in events:
                yield event
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer


async def prefill_outcome(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                          reservation: Reservation | None, deadline: Deadline) -> instance_pb2.PrefillResponse:
    """Only the outcome (a prompt-only request: no first token comes before it)."""
    done = None
    async with contextlib.aclosing(stream_prefill(ctx, sub, candidates, reservation, deadline)) as events:
        async for event in events:
            if event.HasField("done"):
                done = event.done
    return done


def prefill_message(sub: SubRequest, reservation: Reservation | None) -> instance_pb2.PrefillRequest:
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
    if sub.parent.adapter is not None:
        message.lora_adapter.CopyFrom(sub.parent.adapter_ref())
    return message
