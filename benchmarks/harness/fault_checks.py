"""What a fault's verification looks at (benchmarks.harness.fault_evidence): each function
reads the system and returns a `Check`.

- a stopped process tree: /proc/PID/stat's state is `T` for every process of it;
- a kill and restart: the old process is gone (its pid absent, or reused by a process started
  later), a new pid runs, the supervisor's restart count rose, the service registered again;
- a network rule: its iptables counters (`iptables -L OUTPUT -v -x -n`) are above zero;
- a delayer (latency, reorder, bandwidth, loss): it held a packet past its arrival (or dropped
  one), by its own count;
- a memory limit: an OOM kill counted in the group, or a process started inside it;
- an overload burst: requests arrived faster than the base rate could explain.
"""

import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.fault_evidence import Check

STOPPED_STATES = ("T", "t")  # stopped by a signal; stopped by a tracer
STATE_TIMEOUT_S = 5.0  # a signal's effect on /proc is asynchronous: how long to watch for it


def process_state(pid: int) -> str | None:
    """/proc/PID/stat's state letter (R, S, D, T, Z...), None once the process is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from the state on (field 3), the command name skipped whatever it holds."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as a pid and its start time (clock ticks after boot): a reused pid is another process."""

    pid: int
    start_ticks: int | None

    @classmethod
    def of(cls, pid: int) -> "ProcessIdentity":
        fields = _stat_fields(pid)
        return cls(pid, int(fields[19]) if fields else None)

    def is_alive(self) -> bool:
        now = ProcessIdentity.of(self.pid)
        return now.start_ticks is not None and now.start_ticks == self.start_ticks \
            and process_state(self.pid) != "Z"


def stopped(name: str, pids: list[int]) -> Check:
    """Every process of `pids` shows state T (watched for up to STATE_TIMEOUT_S)."""
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while True:
        states = {pid: process_state(pid) for pid in pids}
        is_stopped = bool(pids) and all(state in STOPPED_STATES for state in states.values())
        if is_stopped or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    observed = " ".join(f"{pid}:{state or 'gone'}" for pid, state in states.items()) or "no processes"
    return Check(f"{name}'s {len(pids)} process(es) stopped (state T in /proc/PID/stat)", observed, is_stopped)


def replaced(name: str, old: ProcessIdentity, new_pid: int | None) -> list[Check]:
    """The old process is gone and another runs in its place."""
    new = ProcessIdentity.of(new_pid) if new_pid is not None else None
    is_new = new is not None and new.start_ticks is not None and new != old and new.is_alive()
    return [Check(f"{name}'s old pid {old.pid} gone", "gone" if not old.is_alive() else "still running",
                  not old.is_alive()),
            Check(f"{name} runs as a new pid", f"pid {new_pid}" + ("" if is_new else " (not a new process)"),
                  is_new)]


def restarted(name: str, restarts_before: int, restarts_now: int) -> Check:
    return Check(f"{name}'s restart count (supervisor) rose", f"{restarts_before} -> {restarts_now}",
                 restarts_now > restarts_before)


def registered(expected: set[str], registered_ids: set[str]) -> Check:
    """Every name of `expected` is registered (in Redis) again."""
    missing = sorted(expected - registered_ids)
    return Check(f"registered again: {', '.join(sorted(expected))}",
                 "all registered" if not missing else f"missing {', '.join(missing)}", not missing)


def rules_matched(fault) -> Check:
    """A netfault.Fault's iptables rules have matched packets (read before its heal removes them)."""
    packets = fault.packets_matched()
    return Check(f"packets matched by the fault's iptables rules (iptables -L OUTPUT -v -x -n, "
                 f"queue {fault.queue})" if fault.queue is not None else
                 "packets matched by the fault's iptables rules (iptables -L OUTPUT -v -x -n)",
                 str(packets), packets > 0)


def delayer_acted(fault) -> Check:
    """A delayer kind's delayer held a packet past its arrival (latency, reorder, bandwidth) or,
    for loss, dropped one (or saw too few packets for a drop to be expected: under 3)."""
    stats = fault.delayer_stats()
    if stats is None:
        return Check("the packet delayer's count", "no answer from the delayer", False)
    observed = (f"queued {stats.queued}, held {stats.delayed} (longest {1000 * stats.longest_hold_s:.3f} ms), "
                f"dropped {stats.dropped}")
    if fault.kind == "loss":
        expected = stats.queued * fault.params.get("percent", 1.0) / 100
        return Check("packets dropped by the delayer", observed + f", ~{expected:.1f} expected",
                     stats.dropped > 0 or (stats.queued > 0 and expected < 3))
    return Check("packets held back by the delayer", observed, stats.delayed > 0)


def memory_pressed(limit, moved_pids: list[int], victim_pids: list[int]) -> Check:
    """A memory limit bit: an OOM kill counted in its group, or a process of the victim's tree
    started inside it (a restarted engine core, charged in full against the limit)."""
    num_kills = limit.num_oom_kills()
    born_inside = sorted((set(limit.pids()) - set(moved_pids)) & set(victim_pids))
    return Check("OOM kills in the memory cgroup, or a process started inside it",
                 f"{num_kills} OOM kill(s); started inside: {born_inside or 'none'}",
                 num_kills > 0 or bool(born_inside))


def burst_arrivals(arrivals: list[float], start: float, end: float, rate: float, factor: float) -> Check:
    """More requests arrived in [start, end) than halfway from the base rate's expectation to the
    burst's (Poisson: at 0.5 req/s x 8 for 20 s, 10 against 80 expected, the cut at 45)."""
    seconds = max(0.0, end - start)
    num = sum(start <= at < end for at in arrivals)
    base, burst = rate * seconds, rate * factor * seconds
    return Check("requests sent during the burst", f"{num} in {seconds:.1f} s (base rate ~{base:.0f}, "
                 f"burst ~{burst:.0f})", num >= (base + burst) / 2)
