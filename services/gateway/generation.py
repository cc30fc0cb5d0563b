"""The one generation path behind both front doors (gRPC Generate and the OpenAI HTTP API).

`generate_stream(state, message, time_remaining)` validates and tokenizes a GenerateRequest,
relays it (routing, fan-out, failover) and yields GenerateResponse messages; it keeps the
gateway's counters and logs (request ids, never prompts). Every failure leaves it as a
GatewayError; a client that goes away (cancellation, or closing the stream) is counted as
cancelled, and closing the stream cancels every downstream call.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from shared.pb.pdserve.v1 import gateway_pb2, generation_pb2

from services.gateway.deadline import client_deadline
from services.gateway.errors import GatewayError
from services.gateway.relay import relay_request
from services.gateway.relay_context import RelayContext
from services.gateway.request_prep import prepare_request
from services.gateway.served_model import ServedModel

logger = logging.getLogger(__name__)


@dataclass
class GatewayState:
    """Filled in once the model is loaded and the cluster view built."""

    default_deadline_s: float
    model: ServedModel | None = None
    relay: RelayContext | None = None


def require_ready(state: GatewayState) -> tuple[ServedModel, RelayContext]:
    """The model and relay context; UNAVAILABLE while the gateway is still starting."""
    if state.model is None or state.relay is None:
        raise GatewayError(grpc.StatusCode.UNAVAILABLE, "the gateway is starting; retry shortly")
    return state.model, state.relay


async def generate_stream(state: GatewayState, message: gateway_pb2.GenerateRequest,
                          time_remaining: float | None = None,
                          ) -> AsyncIterator[generation_pb2.GenerateResponse]:
    """Relay one request; `time_remaining` is the client's deadline (None: the default)."""
    model, relay = require_ready(state)
    relay.stats.num_requests += 1
    request_id = message.request_id or "(unnamed)"
    try:
        prepared = prepare_request(message, model)
        request_id = prepared.request_id
        deadline = client_deadline(time_remaining, state.default_deadline_s)
        stream = relay_request(relay, prepared, deadline)
        async with contextlib.aclosing(stream):
            async for response in stream:
                yield response
        relay.stats.num_completed += 1
    except GatewayError as error:
        relay.stats.record_failure(error.code.name)
        logger.info("request %s failed: %s %s", request_id, error.code.name, error.message[:300])
        raise
    except (asyncio.CancelledError, GeneratorExit):
        relay.stats.num_cancelled += 1
        logger.info("request %s cancelled by the client (or its deadline)", request_id)
        raise
    except Exception as error:
        relay.stats.record_failure(grpc.StatusCode.INTERNAL.name)
        logger.exception("request %s failed in the gateway", request_id)
        raise GatewayError(grpc.StatusCode.INTERNAL,
                           "internal gateway error; see the gateway log") from error
