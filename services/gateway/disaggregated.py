"""One completion through the disaggregated path: Reserve on a decode instance, then either a
prefill on the prefill pool (StreamPrefill, retried on others when one fails) followed by the
Decode stream, or the prompt computed on the decode instance itself (PrefillLocally), as the
placement rule says (services.gateway.placement).

The first token reaches the client as soon as the prefill instance sampled it, before its KV
has landed and before Decode starts (services.gateway.first_token); the Decode stream, which
starts from that token, then goes without it. A prefill instance that fails after its first
token is replaced as any failed one, and the token the client has is the one Decode starts
from (a retry's own sample is ignored). When the completion ends with its first token, no
Decode runs.

While the prompt waits for or runs on a prefill instance, the reservation's lease is renewed
every third of its length, so a queue longer than the lease costs no request. Whatever happens
before Decode starts (failure, client cancel, deadline), the reservation is given back with
Release in the background; once Decode runs, cancelling its call is enough.

A decode instance that dies (or drains away) is told apart from a failing prefill instance by
its health check: the gateway then reserves on another decode instance and runs the prefill
again toward it, and only the lost decode instance is marked suspect. A prefill instance that
hangs while it prefills into a reservation (services.gateway.stall_watch) costs the
reservation: it is given back and the completion starts over on a fresh one (at most
--max-prefill-retries times). Every attempt after the first runs under an id of its own. When the client already
has some of the completion's tokens, the new attempt continues after them (migration.py).
"""

import contextlib
import logging
from collections.abc import AsyncIterator

import grpc

from shared.pb.pdserve.v1 import generation_pb2, instance_pb2
from shared.tracing import add_event, record_failure, span

from services.gateway.deadline import Deadline
from services.gateway.decode_calls import DecodeStart, LocalPrefillRefused, decode_stream, local_prefill_stream
from services.gateway.errors import GatewayError
from services.gateway.first_token import RelayedToken, early_message, ending_message, ends_with_first_token
from services.gateway.migration import continuation, final_message, fix_usage, is_complete, retry_of
from services.gateway.placement import PREFILL_POOL, Placement, place_prefill, prefill_backlog
from services.gateway.prefill_calls import stream_prefill_under_lease
from services.gateway.relay_context import RelayContext
from services.gateway.request_prep import SubRequest
from services.gateway.reservations import DecodeLost, Reservation, ReservationAbandoned, release, reserve
from services.gateway.router import Candidate, prefills_for

logger = logging.getLogger(__name__)


async def run_disaggregated(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                            deadline: Deadline) -> AsyncIterator[generation_pb2.GenerateResponse]:
    """Reserve -> prefill (pool or local) -> decode, again on another decode instance whenever
    the one holding the reservation or running the stream is lost (continuing after the
    tokens already streamed); yields the client's messages."""
    lost: dict[str, str] = {}
    streamed: list[int] = []
    num_attempts = num_abandoned = 0
    while True:
        attempt = continuation(sub, streamed) if streamed else sub
        if num_attempts:  # what an earlier attempt left on the instances (a hung one's work) never collides
            attempt = retry_of(attempt, sub.request_id, num_attempts)
        num_attempts += 1
        with span("gateway.attempt", {"pdserve.attempt": len(lost), "pdserve.num_resumed_tokens": len(streamed),
                                      "pdserve.completion_index": sub.index}) as attempt_span:
            reservation = await reserve(ctx, attempt, candidates, deadline, excluded=lost)
            attempt_span.set_attribute("pdserve.decode_instance", reservation.decode.instance_id)
            try:
                async with contextlib.aclosing(_on_reservation(ctx, attempt, candidates, reservation,
                                                               deadline)) as messages:
                    async for message in messages:
                        streamed.extend(message.token_ids)
                        yield message
                return
            except DecodeLost as loss:
                record_failure(attempt_span, "UNAVAILABLE", str(loss), **{"pdserve.loss_reason": loss.reason})
                _note_loss(ctx, sub, loss, lost, len(streamed))
            except ReservationAbandoned as abandoned:
                record_failure(attempt_span, "UNAVAILABLE", str(abandoned))
                num_abandoned += 1
                if num_abandoned > ctx.max_prefill_retries:
                    raise GatewayError(grpc.StatusCode.UNAVAILABLE, f"prefill hung {num_abandoned} times; "
                                                                    f"the last: {abandoned}") from abandoned
                logger.warning("request %s: %s; starting over on a fresh reservation", sub.request_id, abandoned)
            finally:
                ctx.room.freed()  # this attempt's blocks are free (or freeing): a waiting request may try
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
        add_event("migration", {"pdserve.from_instance": loss.decode.instance_id, "pdserve.loss_reason": loss.reason,
                                "pdserve.num_streamed_tokens": num_streamed})
    logger.warning("request %s: %s; %s on another decode instance", sub.request_id, loss,
                   f"migrating after {num_streamed} tokens" if num_streamed else "reserving")


async def _on_reservation(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                          reservation: Reservation,
                          deadline: Deadline) -> AsyncIterator[generation_pb2.GenerateResponse]:
    placement = _placement(ctx, sub, candidates, reservation)
    if placement.is_local:
        try:
            with span("gateway.local_prefill", {"pdserve.decode_instance": reservation.decode.instance_id},
                      kind="client"):
                async with contextlib.aclosing(local_prefill_stream(ctx, sub, reservation, deadline)) as messages:
                    async for message in messages:
                        yield message
            return
        except LocalPrefillRefused as refusal:
            logger.info("request %s: decode %s refused the local prefill (%s); prefilling on the pool",
                        sub.request_id, reservation.decode.instance_id, refusal)
            _record(ctx, sub, reservation, Placement(PREFILL_POOL, "decode_refused"))
    async with contextlib.aclosing(_prefill_then_decode(ctx, sub, candidates, reservation, deadline)) as messages:
        async for message in messages:
            yield message


def _placement(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
               reservation: Reservation) -> Placement:
    num_uncached = len(sub.prompt_token_ids) - reservation.reply.num_cached_prompt_tokens
    backlog = prefill_backlog(prefills_for(reservation.decode, candidates))
    placement = place_prefill(ctx.placement, num_uncached, backlog)
    return _record(ctx, sub, reservation, placement, num_uncached, backlog)


def _record(ctx: RelayContext, sub: SubRequest, reservation: Reservation, placement: Placement,
            num_uncached: int | None = None, backlog: int | None = None) -> Placement:
    ctx.stats.placements[(placement.where, placement.reason)] += 1
    level = logging.INFO if placement.is_local else logging.DEBUG
    logger.log(level, "request %s: prefill on %s (%s; %s uncached tokens on decode %s, prefill backlog %s)",
               sub.request_id, placement.where, placement.reason, num_uncached, reservation.decode.instance_id,
               backlog, extra={"request_id": sub.request_id, "placement": placement.where,
                               "placement_reason": placement.reason})
    return placement


async def _prefill_then_decode(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                               reservation: Reservation,
                               deadline: Deadline) -> AsyncIterator[generation_pb2.GenerateResponse]:
    decode_started = False
    relayed: RelayedToken | None = None
    done: instance_pb2.PrefillResponse | None = None
    try:
        async with contextlib.aclosing(stream_prefill_under_lease(ctx, sub, candidates, reservation,
                                                                  deadline)) as events:
            async for event in events:
                if event.HasField("done"):
                    done = event.done
                elif relayed is None:  # a retry's own first token is not the client's
                    relayed = RelayedToken.of(event.first_token)
                    yield early_message(sub, event.first_token)
        if done is None:
            raise GatewayError(grpc.StatusCode.INTERNAL, "the prefill stream ended without its outcome")
        if ends_with_first_token(done, relayed):
            message = ending_message(sub, done)
            fix_usage(sub, message)
            yield message
            return
        decode_started = True
        start = _decode_start(done, relayed)
        with span("gateway.decode", {"pdserve.decode_instance": reservation.decode.instance_id}, kind="client"):
            async with contextlib.aclosing(decode_stream(ctx, sub, reservation, start, deadline)) as messages:
                async for message in messages:
                    yield message
    finally:
        if not decode_started:
            ctx.spawn(release(ctx, reservation, sub.request_id), f"release-{sub.request_id}")


def _decode_start(done: instance_pb2.PrefillResponse, relayed: RelayedToken | None) -> DecodeStart:
    if relayed is None:
        return DecodeStart(done.first_token_id, done.first_logprobs if done.HasField("first_logprobs") else None,
                           done.num_cached_prompt_tokens, prompt_logprobs=list(done.prompt_logprobs))
    return DecodeStart(relayed.token_id, relayed.logprobs, done.num_cached_prompt_tokens, relayed=relayed)

