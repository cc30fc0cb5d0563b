"""The Instance gRPC service: routes each RPC to the role handler that serves it.

An RPC the role does not serve gets UNIMPLEMENTED; any RPC before the engine has loaded gets
UNAVAILABLE, and so do new requests (Prefill, StreamPrefill, Reserve, Generate) while
draining. Decode, PrefillLocally and Release still run while draining: they finish or free
work admitted before.

Each RPC binds its request id for logging (shared.logging_setup), so every line logged while
serving it, by any handler, carries `request_id`.
"""

from collections.abc import AsyncIterator

import grpc

from shared.logging_setup import bind_request_id
from shared.pb.pdserve.v1 import generation_pb2, instance_pb2 as pb, instance_pb2_grpc
from services.rpc.errors import ServiceError, rpc_errors


class InstanceServicer(instance_pb2_grpc.InstanceServicer):
    def __init__(self, runtime):
        self.runtime = runtime  # services.instance.runtime.InstanceRuntime

    def _handler(self, kind: str, method: str, is_new_work: bool):
        handlers = self.runtime.handlers
        if handlers is None:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, f"instance {self.runtime.instance_id} is still loading")
        handler = getattr(handlers, kind)
        if handler is None:
            raise ServiceError(grpc.StatusCode.UNIMPLEMENTED, f"a {self.runtime.role} instance does not serve {method}")
        if is_new_work and self.runtime.is_draining:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, f"instance {self.runtime.instance_id} is draining")
        return handler

    async def Prefill(self, request: pb.PrefillRequest, context) -> pb.PrefillResponse:
        bind_request_id(request.request_id)
        async with rpc_errors(context, "Prefill", request.request_id):
            return await self._handler("prefill", "Prefill", True).prefill(request)

    async def StreamPrefill(self, request: pb.PrefillRequest, context) -> AsyncIterator[pb.PrefillEvent]:
        bind_request_id(request.request_id)
        async with rpc_errors(context, "StreamPrefill", request.request_id):
            async for event in self._handler("prefill", "StreamPrefill", True).stream_prefill(request):
                yield event

    async def Reserve(self, request: pb.ReserveRequest, context) -> pb.ReserveResponse:
        bind_request_id(request.request_id)
        async with rpc_errors(context, "Reserve", request.request_id):
            return await self._handler("decode", "Reserve", True).reserve(request, lambda: caller_is_gone(context))

    async def Decode(self, request: pb.DecodeRequest, context) -> AsyncIterator[generation_pb2.GenerateResponse]:
        bind_request_id(request.request_id)
        async with rpc_errors(context, "Decode", request.request_id):
            async for message in self._handler("decode", "Decode", False).decode(request):
                yield message

    async def PrefillLocally(self, request: pb.LocalPrefillRequest,
                             context) -> AsyncIterator[generation_pb2.GenerateResponse]:
        bind_request_id(request.request_id)
        async with rpc_errors(context, "PrefillLocally", request.request_id):
            async for message in self._handler("decode", "PrefillLocally", False).prefill_locally(request):
                yield message

    async def Release(self, request: pb.ReleaseRequest, context) -> pb.ReleaseResponse:
        bind_request_id(request.request_id)
        async with rpc_errors(context, "Release", request.request_id):
            return await self._handler("decode", "Release", False).release(request)

    async def Renew(self, request: pb.RenewRequest, context) -> pb.RenewResponse:
        bind_request_id(request.request_id)
        async with rpc_errors(context, "Renew", request.request_id):
            return await self._handler("decode", "Renew", False).renew(request)

    async def Generate(self, request: pb.InstanceGenerateRequest,
                       context) -> AsyncIterator[generation_pb2.GenerateResponse]:
        bind_request_id(request.request_id)
        async with rpc_errors(context, "Generate", request.request_id):
            async for message in self._handler("generate", "Generate", True).generate(request):
                yield message

    async def SendCachedBlocks(self, request: pb.SendCachedBlocksRequest, context) -> pb.SendCachedBlocksResponse:
        bind_request_id(request.request_id)
        async with rpc_errors(context, "SendCachedBlocks", request.request_id):
            return await self._handler("peer", "SendCachedBlocks", True).send_cached_blocks(request)

    async def LoadLoRAAdapter(self, request: pb.LoadLoRAAdapterRequest, context) -> pb.LoRAAdapterRef:
        async with rpc_errors(context, "LoadLoRAAdapter", ""):
            self._check_loaded()
            key = await self.runtime.load_adapter(request.lora_name, request.lora_path)
            return pb.LoRAAdapterRef(name=request.lora_name, key=key)

    async def UnloadLoRAAdapter(self, request: pb.UnloadLoRAAdapterRequest,
                                context) -> pb.UnloadLoRAAdapterResponse:
        async with rpc_errors(context, "UnloadLoRAAdapter", ""):
            self._check_loaded()
            await self.runtime.unload_adapter(request.lora_name)
            return pb.UnloadLoRAAdapterResponse()

    def _check_loaded(self) -> None:
        if self.runtime.handlers is None:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, f"instance {self.runtime.instance_id} is still loading")

    async def GetStatus(self, request: pb.StatusRequest, context) -> pb.InstanceStatus:
        async with rpc_errors(context, "GetStatus", ""):
            if self.runtime.handlers is None:
                raise ServiceError(grpc.StatusCode.UNAVAILABLE, f"instance {self.runtime.instance_id} is still loading")
            return await self.runtime.status()


def caller_is_gone(context) -> bool:
    """True once the RPC's caller cancelled or its deadline passed: a reply would be lost."""
    remaining = context.time_remaining()
    return context.cancelled() or (remaining is not None and remaining <= 0)
