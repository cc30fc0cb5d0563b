"""One completion on a colocated instance (prefill and decode in one engine).

Instances are tried best first; one that refuses or fails before streaming anything is
skipped, and so is one that hangs (services.gateway.stall_watch). Once tokens have reached the
client, a failure is the client's error (UNAVAILABLE when the instance hung).
"""

import logging
from collections.abc import AsyncIterator

import grpc

from shared.pb.pdserve.v1 import generation_pb2, instance_pb2

from services.gateway.deadline import Deadline
from services.gateway.errors import GatewayError, from_rpc_error, no_capacity
from services.gateway.relay_context import RelayContext, is_failover
from services.gateway.request_prep import SubRequest
from services.gateway.router import Candidate, rank
from services.gateway.stall_watch import InstanceHung, raise_if_hung, watched

logger = logging.getLogger(__name__)


async def run_colocated(ctx: RelayContext, sub: SubRequest, candidates: list[Candidate],
                        deadline: Deadline) -> AsyncIterator[generation_pb2.GenerateResponse]:
    choice = rank(candidates, "colocated")
    ctx.stats.record_route("colocated", choice.reason)
    request = instance_pb2.InstanceGenerateRequest(
        request_id=sub.request_id, prompt_token_ids=sub.parent.prompt_token_ids,
        sampling=sub.sampling_proto())
    if sub.parent.cache_salt:
        request.cache_salt = sub.parent.cache_salt
    if sub.parent.adapter is not None:
        request.lora_adapter.CopyFrom(sub.parent.adapter_ref())
    num_refused = 0
    for target in choice.ranked:
        call = ctx.channels.stub(target.grpc_address).Generate(request, timeout=deadline.remaining())
        has_streamed = False
        try:
            async for message in watched(ctx, call, lambda: raise_if_hung(ctx, target)):
                has_streamed = True
                yield message
            return
        except InstanceHung as hung:
            if has_streamed:
                raise GatewayError(grpc.StatusCode.UNAVAILABLE, f"colocated {hung}") from hung
            ctx.stats.num_colocated_failovers += 1
            logger.warning("request %s: %s; trying another", sub.request_id, hung)
        except grpc.aio.AioRpcError as error:
            if has_streamed or not is_failover(error):
                raise from_rpc_error(error, f"colocated instance {target.instance_id}") from error
            num_refused += _note_failure(ctx, sub, target, error)
        finally:
            if not call.done():
                call.cancel()
    if num_refused:
        raise no_capacity(num_refused, "colocated")
    raise GatewayError(grpc.StatusCode.UNAVAILABLE,
                       f"none of the {len(choice.ranked)} colocated instances could be reached")


def _note_failure(ctx: RelayContext, sub: SubRequest, target: Candidate,
                  error: grpc.aio.AioRpcError) -> int:
    ctx.stats.num_colocated_failovers += 1
    logger.warning("request %s: colocated %s failed before streaming (%s); trying another",
                   sub.request_id, target.instance_id, error.code().name)
    if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return 1
    ctx.view.mark_failed(target.instance_id)
    return 0
