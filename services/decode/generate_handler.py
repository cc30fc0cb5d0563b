"""Generate (colocated role): prefill and decode on this instance's one engine, streamed."""

import contextlib
from collections.abc import AsyncIterator

from shared.engine_api.client import GenerateRequest
from shared.errors import InvalidRequestError
from shared.pb.pdserve.v1 import generation_pb2, instance_pb2 as pb
from shared.wire.outputs import request_output_to_protos
from shared.wire.sampling import sampling_from_proto
from services.instance.role import RoleHandler


class GenerateHandler(RoleHandler):
    def __init__(self, runtime):
        self.engine = runtime.engine
        self.adapters = runtime.adapters

    async def generate(self, request: pb.InstanceGenerateRequest) -> AsyncIterator[generation_pb2.GenerateResponse]:
        if not request.request_id:
            raise InvalidRequestError("request_id", "must not be empty")
        salt = request.cache_salt if request.HasField("cache_salt") else None
        generate = GenerateRequest(request.request_id, tuple(request.prompt_token_ids),
                                   sampling_from_proto(request.sampling), salt,
                                   lora_request=self.adapters.resolve(request))
        is_first = True  # every output carries the prompt logprobs so far: send them once
        async with contextlib.aclosing(self.engine.generate(generate)) as outputs:
            async for output in outputs:
                messages = request_output_to_protos(output, with_prompt_logprobs=is_first)
                is_first = is_first and not messages
                for message in messages:
                    yield message
