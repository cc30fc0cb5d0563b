"""Evidence that a fault took effect, for bench-faults and bench-chaos alike.

A fault that only claims to have happened proves nothing: a SIGSTOP sent to the wrong pid, an
iptables rule on a port nobody uses, a memory limit on a process that never allocates, each
"runs" and leaves the stack untouched. So every injected fault is verified from what the
system shows (benchmarks.harness.fault_checks: /proc states, pids, iptables counters, the
packet delayer's own count, the memory cgroup's OOM kills) and its `FaultEvidence` goes into
the report. A fault without passing evidence is a harness failure: the benchmark exits
non-zero (`exit_status`), whatever the requests did.
"""

from dataclasses import dataclass, field

UNVERIFIED_EXIT_STATUS = 3  # a benchmark's exit status when a fault could not be verified


@dataclass(frozen=True)
class Check:
    """One observation: what was looked at, what it showed, whether that proves the fault."""

    what: str
    observed: str
    ok: bool

    def line(self) -> str:
        return f"[{'ok' if self.ok else 'FAILED'}] {self.what}: {self.observed}"


@dataclass
class FaultEvidence:
    kind: str
    target: str
    checks: list[Check] = field(default_factory=list)

    @property
    def is_verified(self) -> bool:
        """Every check passed, and there was at least one (no evidence is no proof)."""
        return bool(self.checks) and all(check.ok for check in self.checks)

    def lines(self) -> list[str]:
        verdict = "verified" if self.is_verified else "NOT VERIFIED"
        return [f"{self.kind} on {self.target}: {verdict}"] + [f"  {check.line()}" for check in self.checks]


def unverified(evidence: list[FaultEvidence]) -> list[FaultEvidence]:
    return [found for found in evidence if not found.is_verified]


def summary(evidence: list[FaultEvidence]) -> str:
    failed = unverified(evidence)
    text = f"faults verified: {len(evidence) - len(failed)} of {len(evidence)}"
    if failed:
        text += " (NOT VERIFIED: " + ", ".join(f"{e.kind} on {e.target}" for e in failed) + ")"
    return text


def exit_status(evidence: list[FaultEvidence]) -> int:
    """0 when every fault was verified, UNVERIFIED_EXIT_STATUS otherwise."""
    return UNVERIFIED_EXIT_STATUS if unverified(evidence) else 0
