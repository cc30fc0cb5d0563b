"""Network faults on loopback, injected and healed: for fault tests and the chaos benchmark.

    from benchmarks.harness.netfault import inject, injected, process_target, port_target

    decode = process_target("decode-1", decode_pid)      # its process tree and listening ports
    prefill = process_target("prefill-1", prefill_pid)
    with injected("partition", prefill, decode):          # healed on exit, whatever happens
        ...
    fault = inject("latency", decode, delay_ms=200, jitter_ms=50)
    ...
    fault.heal()                                          # idempotent

Kinds (the issue's list; each with the parameters it takes). The first four queue the packets
from or to target's ports (each direction, so a round trip pays twice) to a delayer process
(benchmarks.harness.netfault_queue, on an NFQUEUE: this kernel has no tc netem). Given a peer,
they queue only the packets between target and peer, chosen as a partition chooses them (new
connections: the packets toward the listening side; open ones: both ways). The delayer lets
go of what it holds when healed, so a long `latency` holds a pair's traffic until `heal()` and
then delivers it at once, with no TCP retransmission timer to wait for:

  latency    delay_ms=50, jitter_ms=0   every packet held delay_ms +- a uniform jitter (jitter
                                        reorders packets, as netem's does)
  loss       percent=1.0                that share of the packets dropped
  reorder    percent=25.0, delay_ms=10  that share of the packets sent at once, the rest
                                        delay_ms late, so they overtake each other
  bandwidth  mbit=100                   the packets paced to that rate (both directions share it)

The last two are iptables rules:

  partition  peer=None                  DROP what target's processes send to peer's ports and
                                        what peer's processes send to target's ports
                                        (peer=None: target from everyone, both ways). A peer
                                        given by ports only (Redis) is cut one way, target ->
                                        its ports, which stalls every connection between them
  reset      peer=None                  the established connections between them are aborted
                                        at once (`ss -K`, both ends see a reset), and until
                                        healed every packet between them is answered with a
                                        TCP reset (iptables REJECT --reject-with tcp-reset)

Every kind takes seed=0 (the delayer's draws are reproducible from it).

Targets are `Target`s: a name, the TCP ports it listens on (its KV path: UCX listener and
worker ports; its gRPC port unless left out) and the pids of its process tree (for iptables'
cgroup match: only faults between a pair need them). `process_target` reads
both from a running process tree; `port_target` names ports alone (Redis, a test socket).

Scope and safety. Everything stays on `lo`: every rule is on `-o lo`, nothing leaves the machine.
Faults stack (the first matching rule wins: the newest fault). Every fault is healed by
`Fault.heal()`, by leaving `injected`, by `heal_all()` and at interpreter exit (atexit); its
rules go first, then its delayer releases the packets it holds. `remove_leftovers()` clears
what a killed run left (the tagged iptables rules and cgroups of processes that are gone; a
live run's are left alone; see benchmarks.harness.netfault_rules). Needs root, `iptables`/`ip6tables` with NFQUEUE, `ss`
(Debian: iproute2, iptables) and cgroup v2: `missing_prerequisite()` says why not, for tests to
skip.

A process in a partition or reset fault is moved into a cgroup of its own under
/sys/fs/cgroup[/unified]/pdserve-netfault/ for as long as the fault lasts, then back where it was.
A socket keeps the cgroup it was created in, so the connections the two ends already hold
(UCX keeps them open between transfers) are matched by their local ports, found with `ss`
when the fault starts; connections opened during the fault by the cgroup match.
"""

import atexit
import itertools
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import netfault_rules as rules
from benchmarks.harness.netfault_queue import Stats as DelayerStats
from benchmarks.harness.process_tree import descendants, parent_pids

NetFaultError = rules.NetFaultError
missing_prerequisite = rules.missing_prerequisite
DELAYER_KINDS = ("latency", "loss", "reorder", "bandwidth")
RULE_KINDS = ("partition", "reset")
KINDS = DELAYER_KINDS + RULE_KINDS
REPO_ROOT = Path(__file__).resolve().parents[2]
QUEUE_BASE = 20000  # NFQUEUE numbers: QUEUE_BASE + (pid % 1000) * 16 + n


@dataclass(frozen=True)
class Target:
    """One end of a fault: a name for messages, the ports it listens on, its processes."""

    name: str
    ports: tuple[int, ...] = ()
    pids: tuple[int, ...] = ()

    def without_ports(self, *ports: int) -> "Target":
        """The same target less some ports (e.g. its gRPC port, to hit the KV path only)."""
        return Target(self.name, tuple(p for p in self.ports if p not in ports), self.pids)


def process_target(name: str, pid: int, ports: tuple[int, ...] | None = None) -> Target:
    """`pid` and every process below it (engine core, workers), and the ports they listen on
    now (`ports` overrides them)."""
    pids = (pid, *descendants(pid, parent_pids()))
    return Target(name, tuple(ports) if ports is not None else rules.listening_ports(pids), pids)


def port_target(name: str, *ports: int) -> Target:
    return Target(name, tuple(ports))


@dataclass
class Fault:
    """An injected fault; `heal()` undoes it (idempotent, safe from any thread)."""

    kind: str
    target: Target
    peer: Target | None
    params: dict
    queue: int | None = None  # the delayer kinds' NFQUEUE number
    delayer_exit_code: int | None = None  # once healed: 0 when the delayer let go of all it held
    _tag: str = ""  # its iptables rules' comment
    _delayer: subprocess.Popen | None = field(default=None, repr=False)
    _undo: list = field(default_factory=list, repr=False)
    _healed: bool = False

    @property
    def is_active(self) -> bool:
        return not self._healed

    def describe(self) -> str:
        between = f"{self.target.name}<->{self.peer.name}" if self.peer else self.target.name
        details = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.kind} {between}" + (f" ({details})" if details else "")

    def packets_matched(self) -> int:
        """Packets the fault has caught so far (its rules' counters: queued, dropped or reset),
        for tests to wait on an observable event instead of a sleep."""
        return sum(rules.rule_packets(table, self._tag) for table in rules.IPTABLES) if self._tag else 0

    def delayer_stats(self, timeout_s: float = 10.0) -> DelayerStats | None:
        """What the delayer kinds' delayer did so far (packets queued, held past their arrival,
        dropped); None for the rule kinds, once healed, or when it does not answer in time."""
        delayer = self._delayer
        if delayer is None or delayer.poll() is not None or not self.is_active:
            return None
        delayer.send_signal(signal.SIGUSR1)
        if not select.select([delayer.stdout], [], [], timeout_s)[0]:
            return None
        line = delayer.stdout.readline()
        return DelayerStats.parse(line) if line.startswith("stats ") else None

    def heal(self) -> None:
        with _lock:
            if self._healed:
                return
            self._healed = True
            _active.pop(id(self), None)
            errors = []
            for undo in reversed(self._undo):
                try:
                    undo()
                except rules.NetFaultError as error:
                    errors.append(str(error))
            self._undo.clear()
        if errors:
            raise rules.NetFaultError(f"healing {self.describe()}: {'; '.join(errors)}")


_lock = threading.RLock()
_active: dict = {}  # id(fault) -> fault, for heal_all
_queues_in_use: set[int] = set()
_cgroups: dict[tuple[int, ...], tuple[str, dict[int, str], int]] = {}  # pids -> (path, origins, refs)
_names = itertools.count()


def inject(kind: str, target: Target, peer: Target | None = None, **params) -> Fault:
    """Start `kind` (see the module docstring) on `target` (and `peer`); returns the Fault.
    Raises NetFaultError, having undone any part already in place, when it cannot."""
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(KINDS)}")
    fault = Fault(kind, target, peer, dict(params))
    with _lock:
        try:
            if kind in DELAYER_KINDS:
                _inject_delayer(fault)
            else:
                _inject_rules(fault)
        except BaseException:
            fault.heal()
            raise
        _active[id(fault)] = fault
    return fault


@contextmanager
def injected(kind: str, target: Target, peer: Target | None = None, **params) -> Iterator[Fault]:
    """`inject` for the length of a with-block; healed however the block ends."""
    fault = inject(kind, target, peer, **params)
    try:
        yield fault
    finally:
        fault.heal()


def heal_all() -> None:
    """Heal every fault this process injected and has not healed."""
    with _lock:
        faults = list(_active.values())
    for fault in faults:
        fault.heal()


def remove_leftovers() -> None:
    """Remove what an earlier, killed run left: the iptables rules and cgroups (their processes
    go back to the root cgroup) of processes that are gone, and this process's own. Another
    live process's faults (a chaos benchmark running beside the tests) are left alone, and so
    is anything that names no owner. A killed run's delayer processes are harmless once their
    rules are gone. Refuses while this process has live faults."""
    with _lock:
        if _active:
            raise rules.NetFaultError("faults of this process are active; heal them first")
        for table in rules.IPTABLES:
            rules.delete_rules([table, *spec] for spec in rules.tagged_rules(table)
                               if _is_leftover(rules.rule_owner(spec)))
        root = rules.cgroup2_root()
        parent = root / rules.CGROUP_PARENT if root else None
        if parent is not None and parent.exists():
            for group in parent.iterdir():
                if group.is_dir() and _is_leftover(rules.name_owner(group.name)):
                    rules.remove_cgroup(root, f"{rules.CGROUP_PARENT}/{group.name}")


def _is_leftover(owner: int | None) -> bool:
    return owner == os.getpid() or rules.is_dead(owner)


atexit.register(heal_all)


# ---- delayer kinds: an NFQUEUE and the process that gives its verdicts --------------------

def delayer_arguments(kind: str, params: dict) -> list[str]:
    """netfault_queue's arguments for a delayer kind (defaults in the module docstring)."""
    if kind == "latency":
        return ["--delay-ms", str(params.setdefault("delay_ms", 50)),
                "--jitter-ms", str(params.setdefault("jitter_ms", 0))]
    if kind == "loss":
        return ["--loss-percent", str(params.setdefault("percent", 1.0))]
    if kind == "reorder":
        return ["--reorder-percent", str(params.setdefault("percent", 25.0)),
                "--delay-ms", str(params.setdefault("delay_ms", 10))]
    return ["--mbit", str(params.setdefault("mbit", 100))]


def _inject_delayer(fault: Fault) -> None:
    if fault.peer is None and not fault.target.ports:
        raise ValueError(f"{fault.kind}: target {fault.target.name} has no ports")
    queue = fault.queue = _free_queue()
    arguments = delayer_arguments(fault.kind, fault.params)
    seed = str(fault.params.setdefault("seed", 0))
    delayer = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.harness.netfault_queue", "--queue", str(queue), "--seed", seed,
         *arguments], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                                        os.environ.get("PYTHONPATH")]))})
    fault._delayer = delayer
    fault._undo.append(lambda: _stop_delayer(fault, delayer, queue))
    if delayer.stdout.readline().strip() != "ready":
        raise rules.NetFaultError(f"the packet delayer for {fault.describe()} did not start "
                                  f"(exit code {delayer.wait()})")
    action = ["NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]
    tag = fault._tag = rules.owned_name(f"{next(_names)}-{fault.kind}-{fault.target.name}")
    if fault.peer is None:
        specs = rules.rule_specs(tag, action, None, dports=fault.target.ports)
        specs += rules.rule_specs(tag, action, None, sports=fault.target.ports)
    else:
        specs = _pair_specs(fault, tag, action)
    inserted = rules.insert_rules(specs)
    fault._undo.append(lambda: rules.delete_rules(inserted))  # undone first: no new packets queued


def _free_queue() -> int:
    queue = next(q for q in itertools.count(QUEUE_BASE + os.getpid() % 1000 * 16) if q not in _queues_in_use)
    _queues_in_use.add(queue)
    return queue


def _stop_delayer(fault: Fault, delayer: subprocess.Popen, queue: int) -> None:
    """SIGTERM: it releases what it holds, then exits (killed, it would drop them)."""
    _queues_in_use.discard(queue)
    if delayer.poll() is None:
        delayer.terminate()
        try:
            delayer.wait(10)
        except subprocess.TimeoutExpired:
            delayer.kill()
            delayer.wait()
    delayer.stdout.close()
    fault.delayer_exit_code = delayer.returncode


# ---- iptables kinds ------------------------------------------------------------------------

def _inject_rules(fault: Fault) -> None:
    target, peer = fault.target, fault.peer
    action = ["DROP"] if fault.kind == "partition" else ["REJECT", "--reject-with", "tcp-reset"]
    tag = fault._tag = rules.owned_name(f"{next(_names)}-{fault.kind}-{target.name}")
    specs = []
    if peer is None:
        specs += rules.rule_specs(tag, action, None, dports=target.ports)  # everyone -> target
        specs += rules.rule_specs(tag, action, None, sports=target.ports)  # target's answers
        if target.pids:
            specs += rules.rule_specs(tag, action, _join_cgroup(fault, target))  # target -> anyone
    else:
        specs = _pair_specs(fault, tag, action)
    inserted = rules.insert_rules(specs)
    fault._undo.append(lambda: rules.delete_rules(inserted))
    if fault.kind == "reset":
        _kill_connections(target, peer)


def _pair_specs(fault: Fault, tag: str, action: list[str]) -> list[list[str]]:
    """Rules applying `action` to the packets between the fault's target and peer only: new
    connections by the cgroup their processes are moved into, open ones by their ports."""
    target, peer = fault.target, fault.peer
    if not peer.ports and not target.ports:
        raise ValueError(f"{fault.kind}: neither {target.name} nor {peer.name} has ports")
    specs = []
    if target.pids and peer.ports:
        specs += rules.rule_specs(tag, action, _join_cgroup(fault, target), dports=peer.ports)
    if peer.pids and target.ports:
        specs += rules.rule_specs(tag, action, _join_cgroup(fault, peer), dports=target.ports)
    if not specs:
        raise ValueError(f"{fault.kind}: name the processes (pids) of {target.name} or {peer.name}")
    return specs + _established_specs(tag, action, target, peer) + _established_specs(tag, action, peer, target)


def _established_specs(tag: str, action: list[str], source: Target, destination: Target) -> list[list[str]]:
    """Rules for the connections `source` already holds to `destination`'s ports: a socket keeps
    the cgroup it was created in, so the cgroup match only catches new ones. These are
    matched by their local (ephemeral) ports, both ways."""
    local_ports = [int(local.rsplit(":", 1)[1])
                   for local, _ in rules.established_connections(source.pids, destination.ports)]
    if not local_ports:
        return []
    return (rules.rule_specs(tag, action, None, sports=local_ports)
            + rules.rule_specs(tag, action, None, dports=local_ports))


def _kill_connections(target: Target, peer: Target | None) -> None:
    """Abort the established connections the fault covers (both directions)."""
    pairs = [(target, peer)] + ([(peer, target)] if peer is not None else [])
    for source, destination in pairs:
        if destination is None:
            for local, remote in rules.established_connections(source.pids, _all_ports()):
                rules.kill_connection(local, remote)
            continue
        for local, remote in rules.established_connections(source.pids, destination.ports):
            rules.kill_connection(local, remote)


def _all_ports() -> range:
    return range(1, 65536)


def _join_cgroup(fault: Fault, target: Target) -> str:
    """The cgroup holding `target`'s processes during the fault (shared by the faults on the
    same processes), its release registered with `fault`."""
    key = tuple(sorted(target.pids))
    root = rules.cgroup2_root()
    if root is None:
        raise rules.NetFaultError("no cgroup v2 hierarchy mounted")
    if key not in _cgroups:
        path = rules.make_cgroup(root, rules.owned_name(f"{target.name}-{next(_names)}"))
        origins = {pid: origin for pid in key if (origin := rules.current_cgroup(pid)) is not None}
        _cgroups[key] = (path, origins, 0)
        try:
            rules.move_to_cgroup(root, path, key)
        except rules.NetFaultError:
            _leave_cgroup(key)
            raise
    path, origins, refs = _cgroups[key]
    _cgroups[key] = (path, origins, refs + 1)
    fault._undo.append(lambda: _leave_cgroup(key))
    return path


def _leave_cgroup(key: tuple[int, ...]) -> None:
    path, origins, refs = _cgroups[key]
    if refs > 1:
        _cgroups[key] = (path, origins, refs - 1)
        return
    del _cgroups[key]
    root = rules.cgroup2_root()
    for pid, origin in origins.items():
        rules.move_to_cgroup(root, origin, [pid])
    rules.remove_cgroup(root, path)
