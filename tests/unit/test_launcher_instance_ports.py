"""An instance named in StackConfig.instance_ports keeps its gRPC and UCX ports across restarts
(bench-faults' same-address churn); the others stay on ephemeral ports."""

import pytest

from services.launcher.commands import instance_argv
from services.launcher.config import InstancePorts, StackConfig
from shared.errors import ConfigurationError


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_a_named_instance_gets_its_fixed_ports_and_the_others_ephemeral_ones(tmp_path):
    config = StackConfig(num_prefill=2, instance_ports={"prefill-1": InstancePorts(41001, 41002)})
    fixed = instance_argv(config, "prefill-1", "prefill", "redis://x", tmp_path / "r")
    other = instance_argv(config, "prefill-0", "prefill", "redis://x", tmp_path / "r")
    assert (flag(fixed, "--grpc-port"), flag(fixed, "--ucx-port")) == ("41001", "41002")
    assert (flag(other, "--grpc-port"), flag(other, "--ucx-port")) == ("0", "0")
    assert fixed.count("--grpc-port") == 1 and fixed.count("--ucx-port") == 1


def test_ports_for_an_instance_the_stack_does_not_run_name_the_field():
    with pytest.raises(ConfigurationError, match="instance_ports.*decode-3"):
        StackConfig(instance_ports={"decode-3": InstancePorts(41001, 41002)})


def test_a_port_out_of_range_names_the_field():
    with pytest.raises(ConfigurationError, match="instance_ports.*decode-0"):
        StackConfig(instance_ports={"decode-0": InstancePorts(0, 41002)})
