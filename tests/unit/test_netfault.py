"""The network fault injector (benchmarks.harness.netfault) on plain TCP sockets over loopback:
each kind does what it says to the target's packets only, and healing leaves nothing behind.

The delayer's schedule is tested without root; the rest needs root, iptables with NFQUEUE,
`ss` and cgroup v2, and skips naming what is missing. Delays are checked only from below
(a busy machine makes things slower, never faster); that other traffic is untouched is
checked on the delayer's packet counter, not on a clock.
"""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.harness import netfault, netfault_rules
from benchmarks.harness.netfault_queue import Schedule

TIMEOUT_S = 20.0
CLIENT = """
import socket, sys
held = None
for line in sys.stdin:
    command, _, argument = line.strip().partition(" ")
    try:
        if command == "connect":
            socket.create_connection(("127.0.0.1", int(argument)), timeout=2.0).close()
            print("ok", flush=True)
        elif command == "hold":
            held = socket.create_connection(("127.0.0.1", int(argument)), timeout=20.0)
            print("ok", flush=True)
        elif command == "recv":
            held.settimeout(20.0)
            print("ok" if held.recv(1) else "closed", flush=True)
    except OSError as error:
        print(type(error).__name__, flush=True)
"""


# ---- the delayer's schedule (no root needed) ------------------------------------------------

def test_the_schedule_delays_within_the_jitter_and_lets_the_reordered_share_overtake():
    schedule = Schedule(delay_ms=200, jitter_ms=50, reorder_percent=25, loss_percent=0, mbit=0, seed=3)
    releases = [schedule.release_time(now=0.0, num_bytes=1500) for _ in range(2000)]
    immediate = [r for r in releases if r == 0.0]
    delayed = [r for r in releases if r != 0.0]
    assert 0.2 < len(immediate) / len(releases) < 0.3
    assert min(delayed) >= 0.15 and max(delayed) <= 0.25


def test_the_schedule_drops_its_share_and_paces_to_the_rate():
    lossy = Schedule(delay_ms=0, jitter_ms=0, reorder_percent=0, loss_percent=5, mbit=0, seed=1)
    dropped = sum(lossy.release_time(0.0, 1500) is None for _ in range(4000))
    assert 120 < dropped < 280
    capped = Schedule(delay_ms=0, jitter_ms=0, reorder_percent=0, loss_percent=0, mbit=100, seed=1)
    last = [capped.release_time(0.0, 12_500) for _ in range(80)][-1]  # 1 MB at 12.5 MB/s
    assert last == pytest.approx(0.08)


def test_the_same_seed_gives_the_same_schedule():
    def draws(seed):
        schedule = Schedule(delay_ms=50, jitter_ms=20, reorder_percent=10, loss_percent=5, mbit=0, seed=seed)
        return [schedule.release_time(0.0, 100) for _ in range(100)]
    assert draws(7) == draws(7) != draws(8)


# ---- injected on loopback ------------------------------------------------------------------

@pytest.fixture
def injector():
    reason = netfault.missing_prerequisite()
    if reason is not None:
        pytest.skip(reason)
    netfault.remove_leftovers()
    yield netfault
    netfault.heal_all()
    assert not our_rules(), "a fault left iptables rules behind"


@pytest.fixture
def server():
    """A listening socket; `server.port`, `server.exchange(n)` (n bytes there, 1 back: seconds)."""
    listener = socket.create_server(("127.0.0.1", 0))
    yield Server(listener)
    listener.close()


class Server:
    def __init__(self, listener: socket.socket):
        self.listener = listener
        self.port = listener.getsockname()[1]

    def exchange(self, num_bytes: int) -> float:
        client = socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT_S)
        accepted, _ = self.listener.accept()
        accepted.settimeout(TIMEOUT_S)
        started = time.perf_counter()
        sender = threading.Thread(target=client.sendall, args=(b"x" * num_bytes,))
        sender.start()
        received = 0
        while received < num_bytes:
            received += len(accepted.recv(1 << 20))
        sender.join()
        accepted.sendall(b"y")
        assert client.recv(1) == b"y"
        seconds = time.perf_counter() - started
        client.close()
        accepted.close()
        return seconds

    def accept_and_close(self) -> socket.socket:
        accepted, _ = self.listener.accept()
        return accepted


@pytest.fixture
def client_process():
    """A child process that connects to ports when told (its own process: a fault target)."""
    child = subprocess.Popen([sys.executable, "-c", CLIENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    yield child
    child.stdin.close()
    child.wait(TIMEOUT_S)


def ask(child: subprocess.Popen, command: str) -> str:
    child.stdin.write(command + "\n")
    child.stdin.flush()
    return child.stdout.readline().strip()


def our_rules() -> list:
    """This process's tagged rules (a chaos benchmark running beside the tests has its own)."""
    return [rule for table in netfault_rules.IPTABLES for rule in netfault_rules.tagged_rules(table)
            if netfault_rules.rule_owner(rule) == os.getpid()]


def rules_tagged(tag: str) -> list:
    """[table, *spec] of the rules tagged `tag` (for delete_rules)."""
    return [[table, *rule] for table in netfault_rules.IPTABLES for rule in netfault_rules.tagged_rules(table)
            if f"{netfault_rules.RULE_TAG}:{tag}" in rule]


def queued_packets(fault: netfault.Fault) -> int:
    """Packets the fault's NFQUEUE has seen (its id sequence, /proc/net/netfilter/nfnetlink_queue)."""
    queue = fault.queue
    for line in Path("/proc/net/netfilter/nfnetlink_queue").read_text().splitlines():
        fields = line.split()
        if int(fields[0]) == queue:
            return int(fields[-2])
    raise AssertionError(f"queue {queue} is not bound")


def test_latency_delays_the_targets_packets_each_way_and_no_others(injector, server):
    other = socket.create_server(("127.0.0.1", 0))
    with injector.injected("latency", injector.port_target("server", server.port), delay_ms=50) as fault:
        assert server.exchange(1) >= 2 * 0.050  # the 1 byte there, the answer back
        seen = queued_packets(fault)
        other_client = socket.create_connection(other.getsockname(), timeout=TIMEOUT_S)
        other.accept()[0].close()
        other_client.close()
        assert queued_packets(fault) == seen
    other.close()
    assert not our_rules()


def test_loss_of_every_packet_cuts_the_port_until_healed(injector, server):
    with injector.injected("loss", injector.port_target("server", server.port), percent=100):
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=0.5)
    assert server.exchange(1) >= 0


def test_the_bandwidth_cap_paces_a_bulk_transfer(injector, server):
    with injector.injected("bandwidth", injector.port_target("server", server.port), mbit=50):
        assert server.exchange(2_000_000) >= 2_000_000 * 8 / 50e6


def test_a_partition_cuts_one_process_from_a_port_and_no_one_else(injector, server, client_process):
    client = injector.process_target("client", client_process.pid)
    origin = netfault_rules.current_cgroup(client_process.pid)
    with injector.injected("partition", client, injector.port_target("server", server.port)):
        assert ask(client_process, f"connect {server.port}") == "TimeoutError"
        assert server.exchange(1) >= 0  # this process still reaches it
    assert netfault_rules.current_cgroup(client_process.pid) == origin
    assert ask(client_process, f"connect {server.port}") == "ok"


def test_latency_between_a_pair_holds_only_their_packets_and_delivers_them_when_healed(injector, server,
                                                                                      client_process):
    client = injector.process_target("client", client_process.pid)
    with injector.injected("latency", client, injector.port_target("server", server.port), delay_ms=600_000) as held:
        client_process.stdin.write(f"hold {server.port}\n")  # its SYN is held: no answer yet
        client_process.stdin.flush()
        wait_until(lambda: held.packets_matched() > 0, "the client's packets to be held")
        assert server.exchange(1) >= 0  # this process's packets to the same port pass
    assert held.delayer_exit_code == 0  # it let go of what it held (killed, it would have dropped it)
    assert client_process.stdout.readline().strip() == "ok"  # delivered at the heal, not lost
    server.accept_and_close().close()


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_reset_aborts_the_open_connection_and_refuses_new_ones(injector, server, client_process):
    assert ask(client_process, f"hold {server.port}") == "ok"
    accepted = server.accept_and_close()
    client = injector.process_target("client", client_process.pid)
    with injector.injected("reset", client, injector.port_target("server", server.port)):
        assert ask(client_process, "recv") in ("ConnectionAbortedError", "ConnectionResetError")
        assert ask(client_process, f"connect {server.port}") in ("ConnectionRefusedError", "ConnectionResetError")
    accepted.close()
    assert ask(client_process, f"connect {server.port}") == "ok"


def test_heal_is_idempotent_and_leftovers_of_a_killed_run_are_removed(injector, server):
    fault = injector.inject("latency", injector.port_target("server", server.port))
    fault.heal()
    fault.heal()
    assert not fault.is_active and not our_rules()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_tag, live_tag = f"{gone.stdout.strip()}.leftover", f"{os.getppid()}.live-run"
    for tag in (dead_tag, live_tag):
        netfault_rules.insert_rules(netfault_rules.rule_specs(tag, ["DROP"], None, dports=[server.port]))
    injector.remove_leftovers()
    assert not rules_tagged(dead_tag)  # its process is gone
    assert rules_tagged(live_tag)  # another live process's fault is not ours to remove
    netfault_rules.delete_rules(rules_tagged(live_tag))
