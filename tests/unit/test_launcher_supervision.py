"""Supervision in services.launcher with stand-in services and a real Redis: a child killed
with SIGKILL comes back SERVING with a new pid while the rest keep their pids; a crash-looping
child is given up on; the restart board reaches `pdserve status`; scale-in removes an instance
without a restart; backoff doubles up to its cap."""

import os
import signal
import threading
import time

import pytest

from services.launcher import LocalStack
from services.launcher.readiness import is_serving
from services.launcher.supervisor import ChildRecord, RestartPolicy
from services.cli.status_command import print_board
from tests.unit.test_launcher import fake_config, with_modes

FAST = RestartPolicy(initial_backoff_s=0.1, max_backoff_s=0.4, max_restarts=2, window_s=60.0)


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def supervised(tmp_path):
    stacks = []

    def start(**overrides) -> LocalStack:
        stack = LocalStack(fake_config(tmp_path, restart_policy=FAST, **overrides))
        stack.start()
        stop_event = threading.Event()
        watcher = threading.Thread(target=stack.supervise, args=(stop_event,), daemon=True)
        watcher.start()
        stacks.append((stack, stop_event, watcher))
        return stack

    yield start
    for stack, stop_event, watcher in stacks:
        stop_event.set()
        watcher.join(5)
        stack.stop()


def record(stack: LocalStack, name: str) -> ChildRecord:
    """The supervisor's record of a child (an empty one before its first supervision round)."""
    return next((r for r in stack.supervisor.records() if r.name == name), ChildRecord(name, "?"))


def test_a_killed_instance_is_restarted_and_serves_again(supervised):
    stack = supervised()
    victim, other = stack.instances[0], stack.instances[1]
    old_pid, other_pid = victim.pid, other.pid
    os.kill(old_pid, signal.SIGKILL)
    wait_for(lambda: record(stack, victim.name).num_restarts == 1, 20, "the restart")
    assert victim.pid != old_pid and victim.is_running()
    assert is_serving(stack.addresses[victim.name])
    assert other.pid == other_pid and record(stack, other.name).num_restarts == 0


def test_a_killed_gateway_and_redis_come_back(supervised):
    stack = supervised(num_decode=1)
    os.kill(stack.gateway.pid, signal.SIGKILL)
    os.kill(stack.redis.pid, signal.SIGKILL)
    wait_for(lambda: record(stack, "gateway").num_restarts == 1, 20, "the gateway restart")
    wait_for(lambda: record(stack, "redis").num_restarts == 1, 20, "the redis restart")
    assert is_serving(stack.gateway_address)


def test_a_crash_looping_child_is_given_up_and_the_rest_keep_serving(supervised, monkeypatch):
    with_modes(monkeypatch, decode_1="die_after")
    stack = supervised()
    wait_for(lambda: record(stack, "decode-1").state == "failed", 30, "the crash-loop limit")
    assert record(stack, "decode-1").num_restarts == FAST.max_restarts
    assert record(stack, "decode-1").last_exit_code == 4
    assert all(child.is_running() for child in stack.children() if child.name != "decode-1")


def test_scale_in_removes_an_instance_without_restarting_it(supervised):
    stack = supervised()
    removed = stack.remove_instance("decode-1")
    assert removed.exit_code() == 0
    assert [child.name for child in stack.instances] == ["prefill-0", "decode-0"]
    time.sleep(0.5)  # a few supervision rounds: nothing restarts it
    assert not removed.is_running()
    assert "decode-1" not in {r.name for r in stack.supervisor.records()}


def test_the_restart_board_reaches_pdserve_status(supervised, capsys):
    import redis

    from services.launcher.supervision_board import parse_board
    from shared.cluster.keys import supervisor_key

    stack = supervised(num_decode=1)
    os.kill(stack.instances[0].pid, signal.SIGKILL)
    wait_for(lambda: record(stack, "prefill-0").num_restarts == 1, 20, "the restart")
    client = redis.Redis.from_url(stack.redis_url)
    board = wait_for(lambda: (b := parse_board(client.hgetall(supervisor_key("default"))))
                     and b.get("prefill-0", {}).get("restarts") == 1 and b, 10, "the board")
    assert set(board) == {"redis", "prefill-0", "decode-0", "gateway"}
    print_board(board)
    assert "prefill-0  prefill  running  1" in capsys.readouterr().out


def test_backoff_doubles_up_to_its_cap():
    policy = RestartPolicy(initial_backoff_s=0.5, max_backoff_s=3.0)
    assert [policy.backoff_s(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
