"""LocalActuator on a fake stack: scale-out launches named instances off the caller's thread
and counts them while they start; scale-in SIGTERMs the newest ones and marks the exit as
expected (so the stack's watch does not treat it as a crash)."""

import signal
import threading
import time
from types import SimpleNamespace

from services.launcher.autoscale import LocalActuator


class FakeChild:
    def __init__(self, name: str, role: str):
        self.name, self.role, self.pid = name, role, 1
        self.expected_exit = False
        self.signals: list[int] = []

    def is_running(self) -> bool:
        return not self.signals

    def send_signal(self, signum: int) -> None:
        self.signals.append(signum)


class FakeStack:
    def __init__(self):
        self.config = SimpleNamespace(ready_timeout_s=5.0)
        self.instances = [FakeChild("prefill-0", "prefill"), FakeChild("decode-1", "decode")]
        self.release = threading.Event()

    def start_instances(self, names_and_roles, deadline):
        children = [FakeChild(name, role) for name, role in names_and_roles]
        self.instances.extend(children)
        assert self.release.wait(5.0)
        return children


def wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_scale_out_counts_starting_instances_and_names_them_uniquely():
    stack = FakeStack()
    actuator = LocalActuator(stack)
    actuator.scale("decode", 3)  # returns at once; the two new instances are still starting
    assert actuator.replicas("decode") == 3 and actuator.replicas("prefill") == 1
    stack.release.set()
    wait_for(lambda: not actuator._starting)
    assert sorted(child.name for child in stack.instances) == ["decode-1", "decode-2", "decode-3", "prefill-0"]
    assert actuator.replicas("decode") == 3


def test_scale_in_drains_the_newest_instances_with_sigterm():
    stack = FakeStack()
    stack.instances += [FakeChild("prefill-2", "prefill"), FakeChild("prefill-3", "prefill")]
    actuator = LocalActuator(stack)
    actuator.scale("prefill", 1)
    drained = [child.name for child in stack.instances if child.signals]
    assert drained == ["prefill-2", "prefill-3"]
    assert all(child.expected_exit and child.signals == [signal.SIGTERM]
               for child in stack.instances if child.signals)
    assert actuator.replicas("prefill") == 1 and actuator.replicas("decode") == 1


def test_up_autoscale_needs_a_profile(capsys):
    from services.cli.main import main

    assert main(["up", "--autoscale", "--gateway-port", "0"]) == 2
    assert "--autoscale needs --profile" in capsys.readouterr().err


def test_up_parses_the_planner_flags():
    from services.planner.flags import config_from_args
    from services.cli.main import build_parser

    args = build_parser().parse_args(["up", "--autoscale", "--profile", "p.json", "--min-prefill", "2",
                                      "--max-prefill", "6", "--max-decode", "3", "--ttft-slo", "1.5",
                                      "--itl-slo", "0.05"])
    config = config_from_args(args)
    assert (config.prefill.min_replicas, config.prefill.max_replicas, config.decode.max_replicas) == (2, 6, 3)
    assert (config.ttft_slo_s, config.itl_slo_s) == (1.5, 0.05)


def test_the_planner_reads_the_running_prefill_instances_metrics(tmp_path):
    from services.launcher.autoscale_runner import AutoscaleRunner
    from services.planner.config import PlannerConfig
    from tests.unit.test_planner_logic import PROFILE

    PROFILE.save(tmp_path / "profile.json")
    stack = FakeStack()
    stack.instances.append(FakeChild("prefill-2", "prefill"))
    stack.instances.append(FakeChild("prefill-3", "prefill"))  # still loading: no ready info yet
    stack.ready_info = {"prefill-0": {"metrics_address": "127.0.0.1:9001"},
                        "decode-1": {"metrics_address": "127.0.0.1:9002"},
                        "prefill-2": {"metrics_address": "127.0.0.1:9003"}}
    runner = AutoscaleRunner(stack, PlannerConfig(), tmp_path / "profile.json", -1)
    assert runner.prefill_metrics_urls() == ["http://127.0.0.1:9001/metrics", "http://127.0.0.1:9003/metrics"]
    stack.instances[0].send_signal(signal.SIGTERM)  # the fake child counts as exited: no longer read
    assert runner.prefill_metrics_urls() == ["http://127.0.0.1:9003/metrics"]
