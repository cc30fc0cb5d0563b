"""Time the KV transfer the way a prefill instance ships a prompt: an engine's own KV cache and
layout, sent by the real KVSender over UCX on loopback to a KVReceiver (a small cache of the
same layout), one transfer at a time, timed on the sender until the receiver acknowledges. The
receiver lives in the same process and event loop, so both sides' CPU work is counted on this
host, as it is when a prefill and a decode instance share it (`pdserve profile`)."""

import asyncio
from collections.abc import Sequence
from dataclasses import replace

import torch

from shared.kv_cache.blocks import blocks_for_tokens
from shared.kv_cache.layout import KVCacheLayout
from shared.kv_transfer.ucx.lifecycle import reset_ucx

ACK_TIMEOUT_S = 30.0


def time_loopback_sends(kv_cache: torch.Tensor, layout: KVCacheLayout, prompt_lengths: Sequence[int],
                        repeats: int) -> list[list[float]]:
    """Per prompt length, `repeats` timings (seconds) of shipping that many tokens' blocks of
    `kv_cache`; a first send of the first length warms the connection up, untimed."""
    try:
        return asyncio.run(_time_sends(kv_cache, layout, prompt_lengths, repeats))
    finally:
        reset_ucx()


async def _time_sends(kv_cache: torch.Tensor, layout: KVCacheLayout, prompt_lengths: Sequence[int],
                      repeats: int) -> list[list[float]]:
    from shared.kv_transfer.ucx.transport import KVReceiver, KVSender

    most_blocks = blocks_for_tokens(max(prompt_lengths), layout.block_size)
    if most_blocks > layout.num_blocks:
        raise ValueError(f"prompt_lengths: {max(prompt_lengths)} tokens need {most_blocks} blocks, "
                         f"the cache has {layout.num_blocks}")
    receiver_layout = replace(layout, num_blocks=most_blocks)
    receiver = KVReceiver(receiver_layout.allocate(), receiver_layout)
    sender = KVSender()
    address = await receiver.start()
    timings, count = [], 0
    try:
        for tokens in (prompt_lengths[0], *prompt_lengths):  # the first is a warm-up (connection)
            num_blocks = blocks_for_tokens(tokens, layout.block_size)
            seconds = []
            for _ in range(repeats):
                count += 1
                request_id = f"profile-transfer-{count}"
                dst = list(range(num_blocks))
                receiver.expect(request_id, dst)
                result = await sender.send(address, request_id, kv_cache, layout, list(range(num_blocks)), dst)
                await receiver.wait(request_id, timeout_s=ACK_TIMEOUT_S)
                seconds.append(result.seconds)
            timings.append(seconds)
        return timings[1:]
    finally:
        await sender.close()
        await receiver.close()
