"""The one generation path behind both front doors (gRPC Generate and the OpenAI HTTP API).

`generate_stream(state, message, time_remaining)` validates and tokenizes a GenerateRequest,
relays it (routing, fan-out, failover) and yields GenerateResponse messages; it keeps the
gateway's counters and latency histograms (RequestTimer) and logs each request's lifecycle:
received, routed (relay), first token, finished with reason and token counts, or failed with
its status; every line carries the request id (as the `request_id` field), never text. Every failure leaves it as a
GatewayError; a client that goes away (cancellation, or closing the stream) is counted as
cancelled, and closing the stream cancels every downstream call.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc

from shared.logging_setup import bind_request_id
from shared.pb.pdserve.v1 import gateway_pb2, generation_pb2
from shared.tracing import record_failure, span

from services.gateway.admission import Ticket, prompt_pool
from services.gateway.cluster_view import live_adapters
from services.gateway.deadline import Deadline, client_deadline
from services.gateway.errors import GatewayError, from_exception
from services.gateway.relay import relay_request
from services.gateway.relay_context import RelayContext
from services.gateway.request_prep import prepare_request
from services.gateway.request_timer import RequestTimer
from services.gateway.served_model import ServedModel
from services.gateway.state import GatewayState, require_ready

logger = logging.getLogger(__name__)


async def known_adapters(state: GatewayState) -> list[str]:
    """The LoRA adapters a request's `model` may name: the configured ones and those some live
    instance serves (a configured one no instance serves fails UNAVAILABLE, naming it)."""
    _, relay = require_ready(state)
    return sorted(set(state.lora_modules) | live_adapters(await relay.view.live()))


async def generate_stream(state: GatewayState, message: gateway_pb2.GenerateRequest,
                          time_remaining: float | None = None, is_prompt_only: bool = False,
                          ) -> AsyncIterator[generation_pb2.GenerateResponse]:
    """Relay one request; `time_remaining` is the client's deadline (None: the default);
    `is_prompt_only`: the caller drops the generated token (see PreparedRequest)."""
    model, relay = require_ready(state)
    with span("gateway.request") as request_span:
        async with contextlib.aclosing(_traced_stream(state, model, relay, message, time_remaining,
                                                      is_prompt_only, request_span)) as stream:
            async for response in stream:
                yield response


async def _traced_stream(state: GatewayState, model: ServedModel, relay: RelayContext,
                         message: gateway_pb2.GenerateRequest, time_remaining: float | None, is_prompt_only: bool,
                         request_span) -> AsyncIterator[generation_pb2.GenerateResponse]:
    relay.stats.num_requests += 1
    request_id = message.request_id or "(unnamed)"
    try:
        adapters = await known_adapters(state) if message.model and not model.accepts(message.model) else ()
        with span("gateway.tokenize"):
            prepared = replace(prepare_request(message, model, state.limits, adapters), is_prompt_only=is_prompt_only)
        request_id = prepared.request_id
        bind_request_id(request_id)
        request_span.set_attributes({"pdserve.request_id": request_id, "pdserve.n": prepared.n,
                                     "pdserve.num_prompt_tokens": len(prepared.prompt_token_ids)})
        timer = RequestTimer(state.metrics, model.name, request_id)
        logger.info("request %s received: %d prompt tokens, n=%d", request_id, len(prepared.prompt_token_ids),
                    prepared.n, extra={"request_id": request_id, "num_prompt_tokens": len(prepared.prompt_token_ids)})
        deadline = client_deadline(time_remaining, state.default_deadline_s)
        ticket = await _admit(state, relay, len(prepared.prompt_token_ids), deadline)
        stream = relay_request(relay, prepared, deadline)
        try:
            async with contextlib.aclosing(stream):
                async for response in stream:
                    has_first_token = timer.first_token_at is not None
                    timer.on_message(response)
                    if not has_first_token and timer.first_token_at is not None:
                        request_span.add_event("first_token")
                        ticket.first_token()
                    yield response
        finally:
            ticket.release()
        relay.stats.num_completed += 1
        timer.finish(len(prepared.prompt_token_ids))
        request_span.set_attributes({"pdserve.finish_reason": ",".join(sorted(set(timer.finish_reasons))) or "none",
                                     "pdserve.num_generated_tokens": timer.num_generated_tokens})
    except GatewayError as error:
        relay.stats.record_failure(error.code.name)  # shed requests too (RESOURCE_EXHAUSTED)
        record_failure(request_span, error.code.name, error.message)
        logger.info("request %s failed: %s %s", request_id, error.code.name, error.message[:300],
                    extra={"request_id": request_id, "status": error.code.name})
        raise
    except (asyncio.CancelledError, GeneratorExit):
        relay.stats.num_cancelled += 1
        request_span.add_event("cancelled")
        logger.info("request %s cancelled by the client (or its deadline)", request_id,
                    extra={"request_id": request_id, "status": grpc.StatusCode.CANCELLED.name})
        raise
    except Exception as error:
        answer = from_exception(error)
        relay.stats.record_failure(answer.code.name)
        record_failure(request_span, answer.code.name, answer.message)
        logger.exception("request %s failed in the gateway", request_id,
                         extra={"request_id": request_id, "status": answer.code.name})
        raise answer from error


async def _admit(state: GatewayState, relay: RelayContext, num_tokens: int, deadline: Deadline) -> Ticket:
    """A ticket for the request, or RESOURCE_EXHAUSTED when its predicted wait for a first token
    does not fit (services.gateway.admission); the listing is the cluster view's cached one."""
    pool = prompt_pool(await relay.view.live())
    return state.admission.admit(num_tokens, pool, deadline.seconds_left())
