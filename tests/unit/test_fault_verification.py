"""Fault verification (benchmarks.harness.fault_evidence / fault_checks), for real on cheap
targets: a `sleep` tree stopped, a supervised `sleep` killed and restarted, a network fault on a
loopback port hit by a connection, a memory limit on a shell that restarts its child. Each one
also aimed at a decoy (the control run's misdirection): its verification must fail.

The network and memory tests need root (and iptables with NFQUEUE, cgroup v2 / a memory cgroup);
they skip naming what is missing. Waits are on observable events (a pid in /proc, a restart
count), never on a clock.
"""

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from benchmarks import chaos, chaos_faults, chaos_report
from benchmarks.harness import fault_checks, fault_evidence, memory_cgroup, misdirect, netfault
from benchmarks.harness.fault_evidence import Check, FaultEvidence
from benchmarks.harness.netfault_queue import Stats
from benchmarks.harness.process_tree import descendants, parent_pids
from services.launcher.child import ChildProcess
from services.launcher.supervisor import RestartPolicy, Supervisor

TIMEOUT_S = 20.0
SETTINGS = chaos_faults.FaultSettings(hold_s=0.0, memory_ratio=8.0)


def wait_until(predicate, what: str):
    deadline = time.monotonic() + TIMEOUT_S
    while not (found := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return found


@pytest.fixture
def quick_state_checks(monkeypatch):
    """A victim that will never show state T is not watched for the benchmark's 5 s."""
    monkeypatch.setattr(fault_checks, "STATE_TIMEOUT_S", 0.2)


@pytest.fixture
def decoy():
    with misdirect.decoy() as found:
        yield found


def started_tree(argv: list[str], num_children: int) -> subprocess.Popen:
    process = subprocess.Popen(argv, start_new_session=True)
    wait_until(lambda: len(descendants(process.pid, parent_pids())) >= num_children, "the tree's children")
    return process


def kill_tree(process: subprocess.Popen) -> None:
    for pid in descendants(process.pid, parent_pids()) + [process.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


@pytest.fixture
def sleep_tree():
    """A shell with two `sleep` children: a victim's process tree."""
    process = started_tree(["sh", "-c", "sleep 600 & sleep 600 & wait"], 2)
    yield SimpleNamespace(name="sleepers", pid=process.pid)
    kill_tree(process)


# ---- the evidence itself ----------------------------------------------------------------------

def test_a_fault_is_verified_only_by_checks_that_all_passed_and_no_checks_prove_nothing():
    passed, failed = Check("a", "1", True), Check("b", "0", False)
    assert FaultEvidence("kill -9", "decode-0", [passed]).is_verified
    assert not FaultEvidence("kill -9", "decode-0", [passed, failed]).is_verified
    assert not FaultEvidence("kill -9", "decode-0", []).is_verified
    evidence = [FaultEvidence("kill -9", "decode-0", [passed]), FaultEvidence("SIGSTOP", "redis", [failed])]
    assert fault_evidence.exit_status(evidence) == fault_evidence.UNVERIFIED_EXIT_STATUS
    assert fault_evidence.exit_status(evidence[:1]) == 0
    assert fault_evidence.summary(evidence) == "faults verified: 1 of 2 (NOT VERIFIED: SIGSTOP on redis)"
    assert evidence[1].lines() == ["SIGSTOP on redis: NOT VERIFIED", "  [FAILED] b: 0"]


# ---- SIGSTOP ------------------------------------------------------------------------------------

def test_sigstop_of_a_sleep_tree_shows_state_T_in_every_process(sleep_tree, quick_state_checks):
    pids = [sleep_tree.pid] + descendants(sleep_tree.pid, parent_pids())
    injected = chaos_faults.inject_into(None, "SIGSTOP", sleep_tree, random.Random(0), SETTINGS)
    evidence = injected.verify()
    assert evidence.is_verified, evidence.lines()
    assert evidence.checks[0].observed == " ".join(f"{pid}:T" for pid in pids)
    injected.heal()
    assert not injected.verify().is_verified  # continued: no longer T


def test_a_misdirected_sigstop_stops_the_decoy_and_fails_the_victims_verification(sleep_tree, decoy,
                                                                                   quick_state_checks):
    injected = chaos_faults.inject_into(None, "SIGSTOP", sleep_tree, random.Random(0), SETTINGS, decoy=decoy)
    try:
        wait_until(lambda: fault_checks.process_state(decoy.pid) == "T", "the decoy to stop")
        evidence = injected.verify()
    finally:
        injected.heal()
    assert not evidence.is_verified
    assert ":T" not in evidence.checks[0].observed
    assert f"control run: aimed at {decoy.name}" in injected.notes


# ---- kill -9 and the supervisor's restart -------------------------------------------------------

class SupervisedSleep:
    """What chaos_faults reads of a stack (its supervisor) around one supervised `sleep`."""

    def __init__(self, log_dir):
        self.child = ChildProcess("sleeper", "decode", ["sleep", "600"], log_dir / "sleeper.log")
        self.child.start()
        self.supervisor = Supervisor(RestartPolicy(initial_backoff_s=0.0), restart=lambda child: child.start())

    def restarts(self) -> int:
        self.supervisor.check([self.child])
        return chaos_faults.num_restarts(self, "sleeper")

    def stop(self) -> None:
        self.supervisor.stop()
        self.child.expected_exit = True
        if self.child.is_running():
            self.child.process.kill()
            self.child.process.wait()


@pytest.fixture
def supervised(tmp_path):
    stack = SupervisedSleep(tmp_path)
    yield stack
    stack.stop()


def test_kill_9_then_a_restart_shows_a_new_pid_the_old_one_gone(supervised):
    old_pid = supervised.child.pid
    injected = chaos_faults.inject_into(supervised, "kill -9 decode", supervised.child, random.Random(0), SETTINGS)
    wait_until(lambda: supervised.restarts() == 1, "the supervisor's restart")
    evidence = injected.verify()
    assert evidence.is_verified, evidence.lines()
    assert supervised.child.pid != old_pid
    assert [check.observed for check in evidence.checks] == ["gone", f"pid {supervised.child.pid}", "0 -> 1"]


def test_a_misdirected_kill_leaves_the_victim_running_and_fails_verification(supervised, decoy):
    old_pid, decoy_pid = supervised.child.pid, decoy.pid
    injected = chaos_faults.inject_into(supervised, "kill -9 decode", supervised.child, random.Random(0), SETTINGS,
                                        decoy=decoy)
    wait_until(lambda: decoy.process.poll() is not None, "the decoy's death")
    assert decoy.process.returncode == -signal.SIGKILL
    evidence = injected.verify()
    assert not evidence.is_verified
    assert supervised.restarts() == 0 and supervised.child.pid == old_pid
    assert [check.ok for check in evidence.checks] == [False, False, False]
    assert decoy.pid != decoy_pid  # a killed decoy is started again for the next fault


def test_the_service_registered_again_is_checked_by_name():
    assert fault_checks.registered({"decode-0", "prefill-0"}, {"decode-0", "prefill-0"}).ok
    missing = fault_checks.registered({"decode-0", "prefill-0"}, {"prefill-0"})
    assert not missing.ok and missing.observed == "missing decode-0"


# ---- network faults: iptables counters and the delayer's count ----------------------------------

SERVER = """
import socket
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
while True:
    listener.accept()[0].close()
"""
CLIENT = """
import socket, sys
for line in sys.stdin:
    try:
        socket.create_connection(("127.0.0.1", int(line)), timeout=0.5).close()
        print("ok", flush=True)
    except OSError as error:
        print(type(error).__name__, flush=True)
"""


@pytest.fixture
def network():
    reason = netfault.missing_prerequisite()
    if reason is not None:
        pytest.skip(reason)
    netfault.remove_leftovers()
    yield
    netfault.heal_all()


@pytest.fixture
def server():
    """A process listening on a loopback port: a victim whose ports netfault finds."""
    process = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    port = int(process.stdout.readline())
    yield SimpleNamespace(name="server", pid=process.pid, port=port)
    process.kill()
    process.wait()


@pytest.fixture
def client():
    process = subprocess.Popen([sys.executable, "-c", CLIENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    yield SimpleNamespace(name="client", pid=process.pid, process=process)
    process.stdin.close()
    process.wait(TIMEOUT_S)


def connect(client, port: int) -> str:
    client.process.stdin.write(f"{port}\n")
    client.process.stdin.flush()
    return client.process.stdout.readline().strip()


def test_a_latency_fault_hit_by_a_connection_counts_packets_and_holds_one(network, server):
    injected = chaos_faults.inject_into(None, "net latency 50 ms prefill", server, random.Random(0), SETTINGS)
    try:
        socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S).close()
        evidence = injected.verify()
    finally:
        injected.heal()
    assert evidence.is_verified, evidence.lines()
    matched, held = evidence.checks
    assert int(matched.observed) > 0
    assert held.what == "packets held back by the delayer" and "longest 50.000 ms" in held.observed


def test_a_partition_rule_cut_from_a_port_is_seen_dropping_the_connection_attempt(network, client, server):
    stack = SimpleNamespace(redis_url=f"redis://127.0.0.1:{server.port}")
    injected = chaos_faults.inject_into(stack, "net partition decode-redis", client, random.Random(0), SETTINGS)
    try:
        assert connect(client, server.port) == "TimeoutError"
        evidence = injected.verify()
    finally:
        injected.heal()
    assert evidence.is_verified, evidence.lines()
    assert connect(client, server.port) == "ok"


def test_a_misdirected_network_fault_matches_no_packet_and_fails_verification(network, server, decoy):
    injected = chaos_faults.inject_into(None, "net latency 50 ms prefill", server, random.Random(0), SETTINGS,
                                        decoy=decoy)
    try:
        socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S).close()
        evidence = injected.verify()
    finally:
        injected.heal()
    assert not evidence.is_verified
    assert [(check.observed.split(",")[0], check.ok) for check in evidence.checks] == [
        ("0", False), ("queued 0", False)]


def test_the_delayers_count_says_what_it_held_and_dropped():
    stats = Stats()
    stats.count(now=1.0, release=1.05)
    stats.count(now=1.0, release=1.0)
    stats.count(now=1.0, release=None)
    assert Stats.parse(stats.line()) == Stats(queued=3, delayed=1, dropped=1, longest_hold_s=pytest.approx(0.05))


# ---- memory cgroup ------------------------------------------------------------------------------

@pytest.fixture
def restarting_shell():
    """A shell that starts its `sleep` again whenever it dies: an instance restarting its engine core."""
    if not memory_cgroup.is_available():
        pytest.skip("memory limits need root and a writable memory cgroup")
    process = started_tree(["sh", "-c", "while true; do sleep 600; done"], 1)
    yield SimpleNamespace(name="shell", pid=process.pid)
    kill_tree(process)


def test_a_memory_limit_is_verified_by_the_engine_restarted_inside_it(restarting_shell):
    first = descendants(restarting_shell.pid, parent_pids())
    injected = chaos_faults.inject_into(None, "memory limit decode", restarting_shell, random.Random(0), SETTINGS)
    try:
        wait_until(lambda: injected.verify().is_verified, "a process restarted inside the limit (or an OOM kill)")
    finally:
        injected.heal()
    assert descendants(restarting_shell.pid, parent_pids()) != first  # its sleep was killed and started again


def test_a_misdirected_memory_limit_fails_verification(restarting_shell, decoy):
    first = descendants(restarting_shell.pid, parent_pids())
    injected = chaos_faults.inject_into(None, "memory limit decode", restarting_shell, random.Random(0), SETTINGS,
                                        decoy=decoy)
    try:
        evidence = injected.verify()
    finally:
        injected.heal()
    assert not evidence.is_verified
    assert evidence.checks[0].observed == "0 OOM kill(s); started inside: none"
    assert descendants(restarting_shell.pid, parent_pids()) == first  # its child never died


# ---- overload burst, and the chaos report's rule and verdict -------------------------------------

def test_a_burst_is_verified_only_when_arrivals_pass_halfway_to_the_bursts_rate():
    burst = [100 + i * 0.25 for i in range(80)]  # 4 req/s for 20 s: rate 0.5 x 8
    unchanged = [100 + i * 2.0 for i in range(10)]  # the base 0.5 req/s
    assert fault_checks.burst_arrivals(burst, 100, 120, rate=0.5, factor=8).ok
    assert not fault_checks.burst_arrivals(unchanged, 100, 120, rate=0.5, factor=8).ok


def test_the_chaos_run_writes_its_rescoring_rule_before_the_first_request(tmp_path):
    chaos.write_header(chaos.parse_args(["--out-dir", str(tmp_path)]))
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["rescoring_rule"] == {"version": chaos_report.RESCORING_RULE.version,
                                         "near_tie_nats": chaos_report.NEAR_TIE_NATS,
                                         "text": chaos_report.RESCORING_RULE.text}
    assert f"Rescoring rule v{chaos_report.RESCORING_RULE.version}" in (tmp_path / "report.md").read_text()


def test_a_chaos_fault_never_injected_or_not_verified_fails_the_run():
    verified = chaos_report.FaultRecord("SIGSTOP decode", "decode-0", 1.0, 20.0, 2.0, evidence=FaultEvidence(
        "SIGSTOP decode", "decode-0", [Check("stopped", "1:T", True)]))
    never_injected = chaos_report.FaultRecord("net loss 5% decode", "-", 2.0, 0.0, float("nan"), "not injected")
    assert chaos.verification_status([verified]) == 0
    assert chaos.verification_status([verified, never_injected]) == fault_evidence.UNVERIFIED_EXIT_STATUS
    assert "| yes |" in chaos_report.fault_log([verified]) and "| NO |" in chaos_report.fault_log([never_injected])
