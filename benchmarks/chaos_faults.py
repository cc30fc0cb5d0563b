"""The chaos benchmark's faults: each one injected into the running stack, held, then healed.

A fault kind names what it does and to which role; the victim is drawn among the live children
of that role with the schedule's seeded generator, so a run is reproducible from its seed.
- kill -9 / SIGTERM: the supervisor heals it (starts the process again);
- SIGSTOP: the victim's whole process tree (service, engine core, workers) is stopped for
  `hold_s`, then SIGCONT;
- memory limit: the victim's tree is moved into a memory cgroup limited to its working set times
  `memory_ratio` for `hold_s` (benchmarks.harness.memory_cgroup); the kernel reclaims or OOM-kills,
  the instance restarts its engine core or the supervisor restarts the instance; then the limit
  is lifted.
Recovery is measured by the caller from the heal (the kill itself, SIGCONT, the lifted limit):
until every instance is registered and both gateways answer a probe.
"""

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.harness import memory_cgroup
from benchmarks.harness.process_tree import descendants, parent_pids

PROCESS_KINDS = (
    ("kill -9 prefill", "prefill"), ("kill -9 decode", "decode"), ("kill -9 redis", "redis"),
    ("SIGTERM prefill", "prefill"), ("SIGTERM decode", "decode"),
)
HUNG_KINDS = (("SIGSTOP prefill", "prefill"), ("SIGSTOP decode", "decode"), ("SIGSTOP redis", "redis"))
MEMORY_KINDS = (("memory limit decode", "decode"), ("memory limit prefill", "prefill"))


@dataclass
class Injected:
    kind: str
    victim: str
    injected_at: float
    heal: Callable[[], None] = lambda: None
    notes: list[str] = field(default_factory=list)


@dataclass
class FaultSettings:
    hold_s: float = 20.0  # how long a SIGSTOP or a memory limit lasts
    memory_ratio: float = 0.9  # the memory limit, as a share of the victim's working set


def available_kinds(extra: tuple = ()) -> tuple[tuple[str, str], ...]:
    """Every fault kind this machine can inject (memory limits need root and a memory cgroup)."""
    kinds = PROCESS_KINDS + HUNG_KINDS + tuple(extra)
    return kinds + (MEMORY_KINDS if memory_cgroup.is_available() else ())


def victims(stack, role: str) -> list:
    if role == "redis":
        return [stack.redis]
    return [child for child in stack.instances if child.role == role and child.exit_code() is None]


def tree_pids(pid: int) -> list[int]:
    return [pid] + descendants(pid, parent_pids())


def inject(stack, kind: str, role: str, rng: random.Random, settings: FaultSettings, extra_injectors=None) -> Injected:
    victim = rng.choice(victims(stack, role))
    now = time.monotonic()
    if kind.startswith("kill -9"):
        os.kill(victim.pid, signal.SIGKILL)
        return Injected(kind, victim.name, now)
    if kind.startswith("SIGTERM"):
        os.kill(victim.pid, signal.SIGTERM)
        return Injected(kind, victim.name, now)
    if kind.startswith("SIGSTOP"):
        return _stopped(kind, victim, now)
    if kind.startswith("memory limit"):
        return _memory_limited(kind, victim, settings.memory_ratio, now)
    if extra_injectors and kind in extra_injectors:
        return extra_injectors[kind](stack, kind, victim, rng, now)
    raise ValueError(f"unknown fault kind {kind!r}")


def _stopped(kind: str, victim, now: float) -> Injected:
    pids = tree_pids(victim.pid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)

    def heal() -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    return Injected(kind, victim.name, now, heal, [f"{len(pids)} processes stopped"])


def _memory_limited(kind: str, victim, ratio: float, now: float) -> Injected:
    limit = memory_cgroup.limit_memory(tree_pids(victim.pid), ratio)
    injected = Injected(kind, victim.name, now, notes=[
        f"limit {limit.limit_bytes / 2**20:.0f} MiB = {ratio:g} x working set {limit.start_usage_bytes / 2**20:.0f} MiB"])

    def heal() -> None:
        num_kills = limit.num_oom_kills()
        injected.notes.append(f"{num_kills} OOM kill(s)" if num_kills else "no OOM kill (reclaim sufficed)")
        limit.lift()
    injected.heal = heal
    return injected
