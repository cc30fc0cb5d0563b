"""The chaos benchmark's faults: each one injected into the running stack, held, then healed.

A fault kind names what it does and to which role; the victim is drawn among the live children
of that role with the schedule's seeded generator, so a run is reproducible from its seed.
- kill -9 / SIGTERM: the supervisor heals it (starts the process again);
- SIGSTOP: the victim's whole process tree (service, engine core, workers) is stopped for
  `hold_s`, then SIGCONT;
- memory limit: the victim's tree is moved into a memory cgroup limited to `memory_ratio` x its
  engine core's working set and the engine core is killed once, so that it restarts inside the
  group (benchmarks.harness.memory_cgroup); there the kernel reclaims or OOM-kills, the instance
  restarts its engine core again or, past its restart budget, exits and the supervisor starts it
  again (outside the group); after `hold_s` the limit is lifted.
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
from pathlib import Path
from urllib.parse import urlparse

from benchmarks.harness import memory_cgroup, netfault
from benchmarks.harness.process_tree import descendants, parent_pids

PROCESS_KINDS = (
    ("kill -9 prefill", "prefill"), ("kill -9 decode", "decode"), ("kill -9 redis", "redis"),
    ("SIGTERM prefill", "prefill"), ("SIGTERM decode", "decode"),
)
HUNG_KINDS = (("SIGSTOP prefill", "prefill"), ("SIGSTOP decode", "decode"), ("SIGSTOP redis", "redis"))
MEMORY_KINDS = (("memory limit decode", "decode"), ("memory limit prefill", "prefill"))
# benchmarks.harness.netfault on loopback: (kind, victim role, netfault kind, the peer's role, params).
NETWORK_FAULTS = (
    ("net latency 200 ms +-50 decode", "decode", "latency", None, {"delay_ms": 200, "jitter_ms": 50}),
    ("net latency 50 ms prefill", "prefill", "latency", None, {"delay_ms": 50}),
    ("net loss 5% decode", "decode", "loss", None, {"percent": 5.0}),
    ("net loss 1% prefill", "prefill", "loss", None, {"percent": 1.0}),
    ("net reorder prefill", "prefill", "reorder", None, {"percent": 25.0, "delay_ms": 10}),
    ("net bandwidth 100 Mbit prefill", "prefill", "bandwidth", None, {"mbit": 100}),
    ("net partition prefill-decode", "prefill", "partition", "decode", {}),
    ("net partition decode-redis", "decode", "partition", "redis", {}),
    ("net reset prefill-decode", "prefill", "reset", "decode", {}),
)
NETWORK_KINDS = tuple((name, role) for name, role, *_ in NETWORK_FAULTS)


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
    memory_ratio: float = 1.0  # a memory limit, as a share of the victim engine core's working set


def available_kinds(extra: tuple = ()) -> tuple[tuple[str, str], ...]:
    """Every fault kind this machine can inject (memory limits need root and a memory cgroup)."""
    kinds = PROCESS_KINDS + HUNG_KINDS + tuple(extra)
    kinds += MEMORY_KINDS if memory_cgroup.is_available() else ()
    return kinds + (NETWORK_KINDS if netfault.missing_prerequisite() is None else ())


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
    if kind.startswith("net "):
        return _network_fault(stack, kind, victim, rng, now)
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
    """The victim's tree into a memory cgroup limited to `ratio` x its engine core's working set
    (anonymous memory: what a restart allocates afresh); the engine core is then killed once, as
    an OOM kill would, so that its restart in place happens inside the group and is charged in
    full there (this kernel does not move the charges of pages already in use)."""
    parents = parent_pids()
    engines = sorted(pid for pid, parent in parents.items() if parent == victim.pid)
    working_set = sum(memory_cgroup.anonymous_bytes(pid) for pid in engines)
    limit = memory_cgroup.limit_memory(tree_pids(victim.pid), int(ratio * working_set))
    for pid in engines:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    injected = Injected(kind, victim.name, now, notes=[
        f"limit {limit.limit_bytes / 2**20:.0f} MiB = {ratio:g} x the engine core's {working_set / 2**20:.0f} MiB; "
        "engine core killed to restart inside"])

    def heal() -> None:
        num_kills = limit.num_oom_kills()
        injected.notes.append(f"peak {limit.peak_bytes() / 2**20:.0f} MiB, limit met {limit.num_limit_hits()} times, "
                              f"{num_kills} OOM kill(s)")
        limit.lift()
    injected.heal = heal
    return injected


def _network_fault(stack, kind: str, victim, rng: random.Random, now: float) -> Injected:
    _, _, net_kind, peer_role, params = next(fault for fault in NETWORK_FAULTS if fault[0] == kind)
    target = netfault.process_target(victim.name, victim.pid)
    peer = None
    if peer_role == "redis":
        peer = netfault.port_target("redis", urlparse(stack.redis_url).port)
    elif peer_role is not None:
        other = rng.choice(victims(stack, peer_role))
        peer = netfault.process_target(other.name, other.pid)
    fault = netfault.inject(net_kind, target, peer, seed=rng.randrange(10**6), **params)
    _delayers_at_normal_priority()
    return Injected(kind, victim.name + (f"<->{peer.name}" if peer else ""), now, fault.heal, [fault.describe()])


def _delayers_at_normal_priority() -> None:
    """A delayer stands for the network: it must not inherit the benchmark's `chrt --idle` /
    `nice`, or on a busy machine it holds packets for seconds instead of milliseconds."""
    for pid in descendants(os.getpid(), parent_pids()):
        with contextlib.suppress(OSError):
            if b"netfault_queue" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, pid, 0)
