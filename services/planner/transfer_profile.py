"""Measure the KV transfer the way a prefill instance ships a prompt, through the engine's probe
(shared.engine_api.probe): the engine's own KV cache sent over UCX on loopback to a receiver in
the same process, one transfer at a time, timed on the sender until the receiver acknowledges,
so both sides' CPU work is counted on this host, as it is when a prefill and a decode instance
share it.
"""

import logging
import statistics
from dataclasses import dataclass

from shared.engine_api.probe import EngineProbe

from services.cost_model.perf_profile import TransferPoint

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TransferPlan:
    prompt_lengths: tuple[int, ...] = (64, 128, 256, 512, 1024)
    repeats: int = 3


QUICK_TRANSFER_PLAN = TransferPlan(prompt_lengths=(16, 64), repeats=1)


def measure_transfer(probe: EngineProbe, plan: TransferPlan) -> list[TransferPoint]:
    """(prompt tokens, seconds) for shipping that many tokens' blocks of the engine's KV cache."""
    timings = probe.time_kv_sends(plan.prompt_lengths, plan.repeats)
    points = [TransferPoint(tokens, statistics.median(seconds))
              for tokens, seconds in zip(plan.prompt_lengths, timings)]
    for point in points:
        logger.info("KV transfer %d tokens: %.2f ms", point.prompt_tokens, point.seconds * 1e3)
    return points
