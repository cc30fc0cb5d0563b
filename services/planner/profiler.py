"""Measure one engine instance in-process, through its probe (shared.engine_api.probe): prefill
time vs prompt length (fresh and with prefix hits), decode step time vs batch size and context
length, KV capacity in tokens, the KV transfer time vs prompt length (transfer_profile), and how
much slower the instance runs while a second instance on the same host is busy (a
`busy_neighbour` process).

Prompts are random token ids (EOS ignored), each with its own seed so that fresh prompts never
hit the prefix cache; a hit is measured by re-sending a prompt that shares a known prefix.
"""

import contextlib
import logging
import os
import random
import statistics
import subprocess
import sys
from dataclasses import dataclass, field

from shared.engine_api.probe import EngineProbe
from shared.engine_args import EngineArgs

from services.instance.engine_setup import build_engine_probe
from services.cost_model.perf_profile import DecodePoint, PerfProfile, PrefillPoint
from services.planner.tier_profile import QUICK_TIER_PLAN, TierPlan, measure_tier_loads, peer_points
from services.planner.transfer_profile import QUICK_TRANSFER_PLAN, TransferPlan, measure_transfer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProfilePlan:
    prompt_lengths: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
    # Fractions of a prompt already cached when it arrives (prefix hits).
    hit_fractions: tuple[float, ...] = (0.5, 0.9)
    hit_prompt_length: int = 512
    batch_sizes: tuple[int, ...] = (1, 4, 8, 32, 64)
    context_lengths: tuple[int, ...] = (128, 512)
    # Decode grid points whose batch x context exceeds this are skipped (their prefill is slow).
    max_decode_tokens: int = 16384
    decode_steps: int = 6
    repeats: int = 2
    transfer: TransferPlan | None = field(default_factory=TransferPlan)
    # Prompt lengths and (batch, context) decode points re-measured beside a busy neighbour
    # (each must also be in the main grid); empty: no co-location measurement.
    colocated_prompts: tuple[int, ...] = (128, 256, 512)
    colocated_decode: tuple[tuple[int, int], ...] = ((8, 128), (32, 128), (8, 512))
    tiers: TierPlan | None = field(default_factory=TierPlan)


QUICK_PLAN = ProfilePlan(prompt_lengths=(8, 16, 32, 64), hit_fractions=(0.5,), hit_prompt_length=64,
                         batch_sizes=(1, 4, 8), context_lengths=(16, 48), decode_steps=3, repeats=1,
                         transfer=QUICK_TRANSFER_PLAN, colocated_prompts=(), colocated_decode=(),
                         tiers=QUICK_TIER_PLAN)


class Profiler:
    def __init__(self, probe: EngineProbe, plan: ProfilePlan, seed: int = 0):
        self.probe = probe
        self.info = probe.info
        self.plan = plan
        self.rng = random.Random(seed)
        self.vocab_size = self.info.vocab_size

    def random_prompt(self, length: int) -> list[int]:
        return [self.rng.randrange(3, self.vocab_size) for _ in range(length)]

    def run(self, model: str, dtype: str, num_threads: int | None, neighbour_command: list[str] | None = None
            ) -> PerfProfile:
        prefill = self.measure_prefill() + self.measure_prefix_hits()
        decode = self.measure_decode()
        transfer = []
        if self.plan.transfer is not None:
            transfer = measure_transfer(self.probe, self.plan.transfer)
        tier_loads = self.measure_tier_loads(transfer)
        slowdown = 1.0
        if neighbour_command and (self.plan.colocated_prompts or self.plan.colocated_decode):
            slowdown = self.measure_colocated_slowdown(neighbour_command, prefill, decode)
        block_size = self.info.cache.block_size
        return PerfProfile(model=model, dtype=dtype, num_threads=num_threads, block_size=block_size,
                           kv_capacity_tokens=self.info.num_blocks * block_size, prefill=prefill, decode=decode,
                           transfer=transfer, host_cores=len(os.sched_getaffinity(0)), colocated_slowdown=slowdown,
                           tier_loads=tier_loads)

    def measure_tier_loads(self, transfer: list) -> list:
        """Host and file tier loads, and peer pulls from the transfer points (docs/kv_tiers.md)."""
        if self.plan.tiers is None:
            return []
        points = measure_tier_loads(self.probe, self.plan.tiers)
        return points + peer_points(transfer, self.info.cache.block_size)

    # ---- prefill -------------------------------------------------------------------------

    def _time_to_finish(self, prompt: list[int]) -> float:
        """Seconds to compute `prompt` and sample its first token, alone in the engine."""
        return self.probe.time_lone_prompt(prompt)

    def measure_prefill(self) -> list[PrefillPoint]:
        self._time_to_finish(self.random_prompt(16))  # warm-up
        points = []
        for length in self.plan.prompt_lengths:
            seconds = statistics.median(self._time_to_finish(self.random_prompt(length))
                                        for _ in range(self.plan.repeats))
            points.append(PrefillPoint(length, 0, seconds))
            logger.info("prefill %d tokens: %.1f ms", length, seconds * 1e3)
        return points

    def measure_prefix_hits(self) -> list[PrefillPoint]:
        length, block_size = self.plan.hit_prompt_length, self.info.cache.block_size
        points = []
        for fraction in self.plan.hit_fractions:
            cached = int(length * fraction) // block_size * block_size
            timings = []
            for _ in range(self.plan.repeats):
                shared_prefix = self.random_prompt(cached)
                self._time_to_finish(shared_prefix + self.random_prompt(length - cached))
                timings.append(self._time_to_finish(shared_prefix + self.random_prompt(length - cached)))
            points.append(PrefillPoint(length, cached, statistics.median(timings)))
            logger.info("prefill %d tokens, %d cached: %.1f ms", length, cached, points[-1].seconds * 1e3)
        return points

    # ---- decode --------------------------------------------------------------------------

    def _decode_step_seconds(self, batch_size: int, context: int) -> float:
        """Median step time of `batch_size` sequences decoding at ~`context` tokens of context."""
        prompts = [self.random_prompt(context) for _ in range(batch_size)]
        return statistics.median(self.probe.time_decode_steps(prompts, self.plan.decode_steps))

    def measure_decode(self) -> list[DecodePoint]:
        points = []
        for context in self.plan.context_lengths:
            for batch_size in self.plan.batch_sizes:
                if batch_size * context > self.plan.max_decode_tokens:
                    continue
                seconds = self._decode_step_seconds(batch_size, context)
                points.append(DecodePoint(batch_size, context, seconds))
                logger.info("decode batch %d at %d tokens: %.1f ms/step", batch_size, context, seconds * 1e3)
        return points


    # ---- co-location -----------------------------------------------------------------------

    def measure_colocated_slowdown(self, neighbour_command: list[str], prefill: list[PrefillPoint],
                                   decode: list[DecodePoint]) -> float:
        """Median ratio of the chosen points' times beside a busy neighbour to their times alone.
        A P/D host pairs the two loads: prefill points are measured beside a neighbour that
        decodes (`--work decode`), decode points beside one that prefills (`neighbour_command`)."""
        alone_prefill = {p.prompt_tokens: p.seconds for p in prefill if p.cached_tokens == 0}
        alone_decode = {(p.batch_size, p.context_tokens): p.seconds for p in decode}
        ratios = []
        if self.plan.colocated_prompts:
            with _busy_neighbour([*neighbour_command, "--work", "decode"]):
                for length in self.plan.colocated_prompts:
                    seconds = statistics.median(self._time_to_finish(self.random_prompt(length))
                                                for _ in range(self.plan.repeats))
                    ratios.append(seconds / alone_prefill[length])
                    logger.info("beside a decoding neighbour: prefill %d tokens %.1f ms (x%.2f)", length,
                                seconds * 1e3, ratios[-1])
        if self.plan.colocated_decode:
            with _busy_neighbour(neighbour_command):
                for batch_size, context in self.plan.colocated_decode:
                    seconds = self._decode_step_seconds(batch_size, context)
                    ratios.append(seconds / alone_decode[(batch_size, context)])
                    logger.info("beside a prefilling neighbour: decode batch %d at %d tokens %.1f ms (x%.2f)",
                                batch_size, context, seconds * 1e3, ratios[-1])
        return max(1.0, statistics.median(ratios))


@contextlib.contextmanager
def _busy_neighbour(command: list[str]):
    """A neighbour process at work for the duration of the block (stopped by closing its stdin)."""
    neighbour = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if neighbour.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the busy neighbour {command} exited before it was ready")
        yield
    finally:
        neighbour.stdin.close()
        try:
            neighbour.wait(timeout=30)
        except subprocess.TimeoutExpired:
            neighbour.kill()
            neighbour.wait()


def neighbour_command_for(model: str | None, dtype: str, num_threads: int | None,
                          prompt_tokens: int = 256) -> list[str]:
    command = [sys.executable, "-m", "services.planner.busy_neighbour", "--dtype", dtype,
               "--prompt-tokens", str(prompt_tokens)]
    if model:
        command += ["--model", model]
    if num_threads:
        command += ["--num-threads", str(num_threads)]
    return command


def profile_instance(args: EngineArgs, plan: ProfilePlan) -> PerfProfile:
    """Build an engine like a serving instance's (from the same EngineArgs) and measure it."""
    probe = build_engine_probe(args)
    model, num_threads = args.model or None, args.num_threads or None
    try:
        return Profiler(probe, plan).run(model or "default", args.dtype, num_threads,
                                         neighbour_command_for(model, args.dtype, num_threads))
    finally:
        probe.shutdown()
