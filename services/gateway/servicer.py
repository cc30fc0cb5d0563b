"""The public Gateway gRPC service: Generate (streamed), ListModels, Tokenize.

Requests before the gateway is ready (model not loaded yet) get UNAVAILABLE. Every failure
reaches the client as a gRPC status with a message; logs carry request ids, never prompts.
"""

import contextlib
import logging

import grpc

from shared.pb.pdserve.v1 import gateway_pb2, gateway_pb2_grpc

from services.gateway.errors import GatewayError
from services.gateway.generation import generate_stream, known_adapters
from services.gateway.state import GatewayState
from services.gateway.lora_admin import load_adapter_everywhere, unload_adapter_everywhere
from services.gateway.rate_limits import retry_after_header
from services.gateway.relay_context import RelayContext
from services.gateway.request_prep import tokenize_request
from services.gateway.served_model import ServedModel

logger = logging.getLogger(__name__)

__all__ = ["GatewayServicer"]


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, state: GatewayState):
        self.state = state

    async def Generate(self, request, context):
        await self._ready(context)
        stream = generate_stream(self.state, request, context.time_remaining())
        try:
            async with contextlib.aclosing(stream):
                async for message in stream:
                    yield message
        except GatewayError as error:
            if error.retry_after_s is not None:
                context.set_trailing_metadata((("retry-after", retry_after_header(error.retry_after_s)),))
            await context.abort(error.code, error.message)

    async def ListModels(self, request, context):
        model, _ = await self._ready(context)
        adapters = [gateway_pb2.ModelCard(id=name, max_model_len=model.max_model_len, parent=model.name)
                    for name in await known_adapters(self.state)]
        return gateway_pb2.ListModelsResponse(
            models=[gateway_pb2.ModelCard(id=model.name, max_model_len=model.max_model_len), *adapters])

    async def LoadLoRAAdapter(self, request, context):
        await self._ready(context)
        try:
            instance_ids = await load_adapter_everywhere(self.state.relay, request.lora_name, request.lora_path)
        except GatewayError as error:
            await context.abort(error.code, error.message)
        return gateway_pb2.LoRAAdapterResponse(instance_ids=instance_ids)

    async def UnloadLoRAAdapter(self, request, context):
        await self._ready(context)
        try:
            instance_ids = await unload_adapter_everywhere(self.state.relay, request.lora_name)
        except GatewayError as error:
            await context.abort(error.code, error.message)
        return gateway_pb2.LoRAAdapterResponse(instance_ids=instance_ids)

    async def Tokenize(self, request, context):
        model, _ = await self._ready(context)
        try:
            token_ids = tokenize_request(request, model, self.state.limits, await known_adapters(self.state))
        except GatewayError as error:
            await context.abort(error.code, error.message)
        return gateway_pb2.TokenizeResponse(
            token_ids=token_ids, tokens=model.tokenizer.convert_ids_to_tokens(token_ids))

    async def _ready(self, context) -> tuple[ServedModel, RelayContext]:
        if self.state.model is None or self.state.relay is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the gateway is starting; retry shortly")
        return self.state.model, self.state.relay
