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

Each fault is verified before it is healed (`Injected.verify()`, benchmarks.harness.fault_checks):
a kill or SIGTERM by the victim's new pid (the old one gone) and its restart count, a SIGSTOP by
state T for every process of the victim's tree, a network fault by its iptables rules' counters
(and for the delayer kinds a packet held back or dropped), a memory limit by an OOM kill in the
group or a process started inside it. Under `decoy` (the control run) the fault is aimed at the
decoy while the checks still read the victim, so they fail.
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

from benchmarks.harness import fault_checks, memory_cgroup, netfault
from benchmarks.harness.fault_checks import ProcessIdentity
from benchmarks.harness.fault_evidence import Check, FaultEvidence
from benchmarks.harness.misdirect import Decoy
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
    checks: Callable[[], list[Check]] = lambda: []  # what proves it took effect; run before heal()

    def verify(self) -> FaultEvidence:
        """The fault's evidence, read from the victim (not from where the fault was aimed)."""
        try:
            checks = self.checks()
        except Exception as error:  # noqa: BLE001 - a check that cannot run proves nothing
            checks = [Check("verification", f"could not run: {error!r}", False)]
        return FaultEvidence(self.kind, self.victim, checks)


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


def num_restarts(stack, name: str) -> int:
    """The supervisor's restart count of the child `name`."""
    return next((r.num_restarts for r in stack.supervisor.records() if r.name == name), 0)


def inject(stack, kind: str, role: str, rng: random.Random, settings: FaultSettings, extra_injectors=None,
           decoy: Decoy | None = None) -> Injected:
    """`kind` on a victim of `role` drawn with `rng` (see `inject_into`)."""
    victim = rng.choice(victims(stack, role))
    return inject_into(stack, kind, victim, rng, settings, extra_injectors, decoy)


def inject_into(stack, kind: str, victim, rng: random.Random, settings: FaultSettings, extra_injectors=None,
                decoy: Decoy | None = None) -> Injected:
    """`kind` on `victim` (a stack child), aimed at `decoy` instead when one is given (the control
    run: the fault lands elsewhere and its verification, which reads the victim, fails)."""
    now = time.monotonic()
    aim = decoy.pid if decoy else victim.pid
    if kind.startswith(("kill -9", "SIGTERM")):
        signum = signal.SIGKILL if kind.startswith("kill -9") else signal.SIGTERM
        injected = _signalled(stack, kind, victim, aim, signum, now)
    elif kind.startswith("SIGSTOP"):
        injected = _stopped(kind, victim, aim, now)
    elif kind.startswith("memory limit"):
        injected = _memory_limited(kind, victim, aim, settings.memory_ratio, now)
    elif kind.startswith("net "):
        injected = _network_fault(stack, kind, victim, rng, now, decoy)
    elif extra_injectors and kind in extra_injectors:
        injected = extra_injectors[kind](stack, kind, victim, rng, now)
    else:
        raise ValueError(f"unknown fault kind {kind!r}")
    if decoy:
        injected.notes.append(f"control run: aimed at {decoy.name}")
    return injected


def _signalled(stack, kind: str, victim, aim: int, signum: int, now: float) -> Injected:
    """A kill -9 or SIGTERM, healed by the supervisor: verified by a new pid and a restart."""
    old, restarts_before = ProcessIdentity.of(victim.pid), num_restarts(stack, victim.name)
    os.kill(aim, signum)

    def checks() -> list[Check]:
        return [*fault_checks.replaced(victim.name, old, victim.pid),
                fault_checks.restarted(victim.name, restarts_before, num_restarts(stack, victim.name))]
    return Injected(kind, victim.name, now, checks=checks)


def _stopped(kind: str, victim, aim: int, now: float) -> Injected:
    pids = tree_pids(aim)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)

    def heal() -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    return Injected(kind, victim.name, now, heal, [f"{len(pids)} processes stopped"],
                    checks=lambda: [fault_checks.stopped(victim.name, tree_pids(victim.pid))])


def _memory_limited(kind: str, victim, aim: int, ratio: float, now: float) -> Injected:
    """The victim's tree into a memory cgroup limited to `ratio` x its engine core's working set
    (anonymous memory: what a restart allocates afresh); the engine core is then killed once, as
    an OOM kill would, so that its restart in place happens inside the group and is charged in
    full there (this kernel does not move the charges of pages already in use)."""
    parents = parent_pids()
    engines = sorted(pid for pid, parent in parents.items() if parent == aim)
    working_set = sum(memory_cgroup.anonymous_bytes(pid) for pid in engines)
    moved = tree_pids(aim)
    limit = memory_cgroup.limit_memory(moved, int(ratio * working_set))
    for pid in engines:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    injected = Injected(kind, victim.name, now, notes=[
        f"limit {limit.limit_bytes / 2**20:.0f} MiB = {ratio:g} x the engine core's {working_set / 2**20:.0f} MiB; "
        "engine core killed to restart inside"],
        checks=lambda: [fault_checks.memory_pressed(limit, moved, tree_pids(victim.pid))])

    def heal() -> None:
        num_kills = limit.num_oom_kills()
        injected.notes.append(f"peak {limit.peak_bytes() / 2**20:.0f} MiB, limit met {limit.num_limit_hits()} times, "
                              f"{num_kills} OOM kill(s)")
        limit.lift()
    injected.heal = heal
    return injected


def _network_fault(stack, kind: str, victim, rng: random.Random, now: float, decoy: Decoy | None) -> Injected:
    _, _, net_kind, peer_role, params = next(fault for fault in NETWORK_FAULTS if fault[0] == kind)
    target = netfault.process_target(victim.name, victim.pid)
    if decoy:
        target = netfault.Target(decoy.name, (decoy.port,), (decoy.pid,))
    peer = None
    if peer_role == "redis":
        peer = netfault.port_target("redis", urlparse(stack.redis_url).port)
    elif peer_role is not None:
        other = rng.choice(victims(stack, peer_role))
        peer = netfault.process_target(other.name, other.pid)
    fault = netfault.inject(net_kind, target, peer, seed=rng.randrange(10**6), **params)
    _delayers_at_normal_priority()

    def checks() -> list[Check]:
        found = [fault_checks.rules_matched(fault)]
        return found + ([fault_checks.delayer_acted(fault)] if net_kind in netfault.DELAYER_KINDS else [])
    return Injected(kind, victim.name + (f"<->{peer.name}" if peer else ""), now, fault.heal, [fault.describe()],
                    checks=checks)


def _delayers_at_normal_priority() -> None:
    """A delayer stands for the network: it must not inherit the benchmark's `chrt --idle` /
    `nice`, or on a busy machine it holds packets for seconds instead of milliseconds."""
    for pid in descendants(os.getpid(), parent_pids()):
        with contextlib.suppress(OSError):
            if b"netfault_queue" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, pid, 0)
