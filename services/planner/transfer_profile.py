"""Measure the KV transfer the way a prefill instance ships a prompt: the engine's own KV
cache and layout, sent by the real KVSender over UCX on loopback to a KVReceiver (a small
cache of the same layout), one transfer at a time, timed on the sender until the receiver
acknowledges. The receiver lives in the same process and event loop, so both sides' CPU
work is counted on this host, as it is when a prefill and a decode instance share it.
"""

import asyncio
import logging
import statistics
from dataclasses import dataclass, replace

import torch

from shared.kv_cache.blocks import blocks_for_tokens

from services.common.profile_data import TransferPoint

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TransferPlan:
    prompt_lengths: tuple[int, ...] = (64, 128, 256, 512, 1024)
    repeats: int = 3


QUICK_TRANSFER_PLAN = TransferPlan(prompt_lengths=(16, 64), repeats=1)


async def _measure(kv_cache: torch.Tensor, layout, plan: TransferPlan) -> list[TransferPoint]:
    from shared.transfer.ucx_transport import KVReceiver, KVSender

    most_blocks = blocks_for_tokens(max(plan.prompt_lengths), layout.block_size)
    if most_blocks > layout.num_blocks:
        raise ValueError(f"prompt_lengths: {max(plan.prompt_lengths)} tokens need {most_blocks} blocks, "
                         f"the cache has {layout.num_blocks}")
    receiver_layout = replace(layout, num_blocks=most_blocks)
    receiver = KVReceiver(receiver_layout.allocate(), receiver_layout)
    sender = KVSender()
    address = await receiver.start()
    points, count = [], 0
    try:
        for tokens in (plan.prompt_lengths[0], *plan.prompt_lengths):  # the first is a warm-up (connection)
            num_blocks = blocks_for_tokens(tokens, layout.block_size)
            timings = []
            for _ in range(plan.repeats):
                count += 1
                request_id = f"profile-transfer-{count}"
                dst = list(range(num_blocks))
                receiver.expect(request_id, dst)
                result = await sender.send(address, request_id, kv_cache, layout, list(range(num_blocks)), dst)
                await receiver.wait(request_id, timeout_s=30.0)
                timings.append(result.seconds)
            points.append(TransferPoint(tokens, statistics.median(timings)))
        points = points[1:]
        for point in points:
            logger.info("KV transfer %d tokens: %.2f ms", point.prompt_tokens, point.seconds * 1e3)
        return points
    finally:
        await sender.close()
        await receiver.close()


def measure_transfer(kv_cache: torch.Tensor, layout, plan: TransferPlan) -> list[TransferPoint]:
    """(prompt tokens, seconds) for shipping that many tokens' blocks of `kv_cache`."""
    from shared.transfer.ucx_lifecycle import reset_ucx

    try:
        return asyncio.run(_measure(kv_cache, layout, plan))
    finally:
        reset_ucx()
