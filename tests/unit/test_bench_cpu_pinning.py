"""CPU pinning of the stack's processes (`pdserve up --prefill-cpus 0 --decode-cpus 1
--gateway-cpus 0`), which `make bench` uses to give prefill and decode one core each and keep
the gateway and Redis off the decode core."""

import os
import sys

import pytest

from services.launcher.child import ChildProcess
from shared.errors import ConfigurationError
from services.launcher.config import StackConfig
from services.cli.main import build_parser
from services.cli.up_command import config_from_args


def test_up_flags_set_the_cpus_of_each_role():
    args = build_parser().parse_args(["up", "--prefill-cpus", "0", "--decode-cpus", "1,2"])
    config = config_from_args(args)
    assert (config.cpus_of("prefill"), config.cpus_of("decode")) == ((0,), (1, 2))
    assert config.cpus_of("colocated") == (1, 2)
    assert config.cpus_of("gateway") is None
    assert StackConfig().cpus_of("decode") is None


def test_the_gateway_and_redis_share_the_gateway_cpus():
    config = config_from_args(build_parser().parse_args(["up", "--prefill-cpus", "0", "--gateway-cpus", "0"]))
    assert (config.cpus_of("gateway"), config.cpus_of("redis"), config.cpus_of("decode")) == ((0,), (0,), None)


def test_bad_cpu_lists_are_refused():
    args = build_parser().parse_args(["up", "--decode-cpus", "one"])
    with pytest.raises(ConfigurationError, match="^decode_cpus: expected comma-separated CPU ids, got 'one'"):
        config_from_args(args)


def test_a_pinned_child_runs_on_its_cpus_only(tmp_path):
    cpu = sorted(os.sched_getaffinity(0))[-1]
    argv = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    child = ChildProcess("probe", "decode", argv, tmp_path / "probe.log", cpus=[cpu])
    child.start()
    assert child.wait(30.0) and child.exit_code() == 0
    assert (tmp_path / "probe.log").read_text().strip() == f"[{cpu}]"
