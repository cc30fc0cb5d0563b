"""A progress watchdog on the streams the gateway reads from instances (StreamPrefill, Decode,
PrefillLocally), for instances that are alive but not answering: SIGSTOPped, swapped out, or
cut off while their sockets stay open. Such an instance never fails a call; without this a
stream on it waits until the instance resumes or the request's deadline passes.

Whenever a stream brings no message for `stall_s` (HangTimeouts.stall_s), the caller's
`check_hung` runs: it probes the health of the instances the stream depends on and raises
when one of them does not answer within `health_probe_s`. A slow but live instance answers
its probe and the stream goes on waiting (it is probed again after another `stall_s`), so a
long prefill or a busy engine step never moves a stream. The caller's raise (DecodeLost,
InstanceHung) ends the stream, whose call the caller then cancels: the hung instance, once it
resumes, finds the call cancelled and frees what it held for it.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from grpc_health.v1 import health_pb2

from services.gateway.relay_context import RelayContext
from services.gateway.router import Candidate

Message = TypeVar("Message")
SERVING = health_pb2.HealthCheckResponse.SERVING
_END = object()


class InstanceHung(Exception):
    """An instance stopped answering: no message on its stream, no answer to a health probe."""

    def __init__(self, instance: Candidate, stalled_s: float):
        super().__init__(f"instance {instance.instance_id} is hung: no message for {stalled_s:g} s and no "
                         f"answer to a health probe")
        self.instance = instance


async def is_unresponsive(ctx: RelayContext, instance: Candidate) -> bool:
    """True when the instance does not answer a health probe within health_probe_s (any
    answer, NOT_SERVING too, shows a process that runs)."""
    return await ctx.channels.health(instance.grpc_address, ctx.hang.health_probe_s) is None


def note_hung(ctx: RelayContext, instance: Candidate) -> None:
    """Count a hung instance and route around it for a while (ClusterView.mark_failed)."""
    ctx.stats.hung_instances[instance.role] += 1
    ctx.view.mark_failed(instance.instance_id)


async def raise_if_hung(ctx: RelayContext, instance: Candidate) -> None:
    """InstanceHung when the instance does not answer a health probe."""
    if await is_unresponsive(ctx, instance):
        note_hung(ctx, instance)
        raise InstanceHung(instance, ctx.hang.stall_s)


async def watched(ctx: RelayContext, messages: AsyncIterator[Message],
                  check_hung: Callable[[], Awaitable[None]]) -> AsyncIterator[Message]:
    """`messages` as they come; `check_hung` after every `stall_s` without one (it raises to
    end the stream). The pending read is never cancelled by a timeout, only when this ends."""
    iterator = aiter(messages)
    next_message: asyncio.Future | None = None
    try:
        while True:
            if next_message is None:
                next_message = asyncio.ensure_future(anext(iterator, _END))
            done, _ = await asyncio.wait({next_message}, timeout=ctx.hang.stall_s)
            if not done:
                ctx.stats.num_stall_probes += 1
                await check_hung()
                continue
            message, next_message = next_message.result(), None
            if message is _END:
                return
            yield message
    finally:
        if next_message is not None:
            next_message.cancel()
            next_message.add_done_callback(_retrieve)


def _retrieve(read: asyncio.Future) -> None:
    """The abandoned read's outcome (the call's own failure, after the caller moved on) is
    not an error of anyone's: mark it retrieved."""
    if not read.cancelled():
        read.exception()
