"""Relay one prepared request: pick the path from the live instances, run each completion
(n > 1 fans out into sub-requests), and stream GenerateResponse messages for the client.

Messages carry the client's request id and the completion's index; the request's last
message carries the usage (prompt once, completions summed, cached prompt tokens of the
first completion).
"""

import contextlib
import logging
from collections.abc import AsyncIterator

import grpc

from shared.pb.pdserve.v1 import generation_pb2
from shared.tracing import span

from services.gateway import router
from services.gateway.colocated import run_colocated
from services.gateway.deadline import Deadline
from services.gateway.disaggregated import run_disaggregated
from services.gateway.errors import GatewayError, no_instances
from services.gateway.fanout import merge_streams
from services.gateway.prompt_only import run_prompt_only
from services.gateway.relay_context import RelayContext
from services.gateway.request_prep import PreparedRequest, SubRequest, split_request

logger = logging.getLogger(__name__)


async def relay_request(ctx: RelayContext, request: PreparedRequest,
                        deadline: Deadline) -> AsyncIterator[generation_pb2.GenerateResponse]:
    with span("gateway.route") as route_span:
        candidates = await ctx.view.candidates(request.hashes)
        route = router.plan_route(candidates, ctx.prefer_colocated)
        route_span.set_attributes({"pdserve.route": route or "none",
                                   "pdserve.candidates": [c.instance_id for c in candidates]})
    if request.adapter is not None and not candidates:
        raise GatewayError(grpc.StatusCode.UNAVAILABLE, f"model: no live instance serves the LoRA adapter "
                                                        f"{request.adapter!r}")
    if route is None:
        raise no_instances(router.no_pair_reason(candidates))
    logger.info("request %s routed: %d prompt tokens, n=%d, %s route", request.request_id,
                len(request.prompt_token_ids), request.n, route,
                extra={"request_id": request.request_id, "route": route})
    subs = split_request(request)
    streams = [_sub_stream(ctx, sub, candidates, route, deadline) for sub in subs]
    merged = streams[0] if len(streams) == 1 else merge_streams(streams)
    usage = _UsageTotal(len(subs), len(request.prompt_token_ids))
    async with contextlib.aclosing(merged):
        async for message in merged:
            yield usage.apply(message)


async def _sub_stream(ctx: RelayContext, sub: SubRequest, candidates: list[router.Candidate],
                      route: str, deadline: Deadline) -> AsyncIterator[generation_pb2.GenerateResponse]:
    if route == router.COLOCATED:
        run = run_colocated
    else:
        run = run_prompt_only if sub.parent.is_prompt_only else run_disaggregated
    stream = run(ctx, sub, candidates, deadline)
    async with contextlib.aclosing(stream):
        async for message in stream:
            message.request_id = sub.parent.request_id
            message.index = sub.index
            if sub.index > 0:
                message.ClearField("prompt_logprobs")
            yield message


class _UsageTotal:
    """Strips per-completion usage and puts the request's total on its last message."""

    def __init__(self, num_completions: int, num_prompt_tokens: int):
        self.is_single = num_completions == 1
        self.num_open = num_completions
        self.total = generation_pb2.Usage(prompt_tokens=num_prompt_tokens)

    def apply(self, message: generation_pb2.GenerateResponse) -> generation_pb2.GenerateResponse:
        if self.is_single:
            return message  # the instance's usage is the request's
        if message.HasField("usage"):
            self.total.completion_tokens += message.usage.completion_tokens
            if message.index == 0:
                self.total.cached_prompt_tokens = message.usage.cached_prompt_tokens
            message.ClearField("usage")
        if message.finish_reason != generation_pb2.FINISH_REASON_UNSPECIFIED:
            self.num_open -= 1
            if self.num_open == 0:
                message.usage.CopyFrom(self.total)
        return message
