"""The public Gateway gRPC service: Generate (streamed), ListModels, Tokenize.

Requests before the gateway is ready (model not loaded yet) get UNAVAILABLE. Every failure
reaches the client as a gRPC status with a message; logs carry request ids, never prompts.
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import grpc

from shared.pb.pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.gateway.deadline import client_deadline
from services.gateway.errors import GatewayError
from services.gateway.relay import relay_request
from services.gateway.relay_context import RelayContext
from services.gateway.request_prep import prepare_request, tokenize_request
from services.gateway.served_model import ServedModel

logger = logging.getLogger(__name__)


@dataclass
class GatewayState:
    """Filled in once the model is loaded and the cluster view built."""

    default_deadline_s: float
    model: ServedModel | None = None
    relay: RelayContext | None = None


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, state: GatewayState):
        self.state = state

    async def Generate(self, request, context):
        model, relay = await self._ready(context)
        relay.stats.num_requests += 1
        request_id = request.request_id or "(unnamed)"
        try:
            prepared = prepare_request(request, model)
            request_id = prepared.request_id
            deadline = client_deadline(context.time_remaining(), self.state.default_deadline_s)
            stream = relay_request(relay, prepared, deadline)
            async with contextlib.aclosing(stream):
                async for message in stream:
                    yield message
            relay.stats.num_completed += 1
        except GatewayError as error:
            relay.stats.record_failure(error.code.name)
            logger.info("request %s failed: %s %s", request_id, error.code.name, error.message[:300])
            await context.abort(error.code, error.message)
        except asyncio.CancelledError:
            relay.stats.num_cancelled += 1
            logger.info("request %s cancelled by the client (or its deadline)", request_id)
            raise
        except Exception:
            relay.stats.record_failure(grpc.StatusCode.INTERNAL.name)
            logger.exception("request %s failed in the gateway", request_id)
            await context.abort(grpc.StatusCode.INTERNAL, "internal gateway error; see the gateway log")

    async def ListModels(self, request, context):
        model, _ = await self._ready(context)
        return gateway_pb2.ListModelsResponse(
            models=[gateway_pb2.ModelCard(id=model.name, max_model_len=model.max_model_len)])

    async def Tokenize(self, request, context):
        model, _ = await self._ready(context)
        try:
            token_ids = tokenize_request(request, model)
        except GatewayError as error:
            await context.abort(error.code, error.message)
        return gateway_pb2.TokenizeResponse(
            token_ids=token_ids, tokens=model.tokenizer.convert_ids_to_tokens(token_ids))

    async def _ready(self, context) -> tuple[ServedModel, RelayContext]:
        if self.state.model is None or self.state.relay is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the gateway is starting; retry shortly")
        return self.state.model, self.state.relay
