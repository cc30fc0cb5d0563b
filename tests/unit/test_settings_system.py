"""The one settings system (services.settings.service_settings): for every service, a flag wins over
its PDSERVE_* variable, which wins over the --config TOML file, which wins over the default;
a bad value from any of them is refused naming the setting."""

import argparse

import pytest

from services.cli.main import build_parser as cli_parser
from services.cli.up_command import config_from_args as stack_config
from services.instance.flags import parse_settings as instance_settings
from services.instance.settings import InstanceSettings
from services.gateway.settings import GatewaySettings, parse_settings as gateway_settings
from services.planner.flags import config_from_args as planner_config
from services.planner.main import build_parser as planner_parser
from services.planner.main import main as planner_main
from shared.errors import ConfigurationError

ROLES = ("decode", "colocated")


@pytest.fixture(autouse=True)
def no_pdserve_variables(monkeypatch):
    import os

    for name in [name for name in os.environ if name.startswith("PDSERVE_")]:
        monkeypatch.delenv(name)


def write_config(tmp_path, text: str) -> str:
    path = tmp_path / "settings.toml"
    path.write_text(text)
    return str(path)


def test_instance_flag_over_env_over_file_over_default(tmp_path, monkeypatch):
    config = write_config(tmp_path, "num_blocks = 11\nlease_ms = 500\nmax_num_seqs = 9\n")
    monkeypatch.setenv("PDSERVE_NUM_BLOCKS", "22")
    monkeypatch.setenv("PDSERVE_LEASE_MS", "600")
    settings = instance_settings("x", ROLES, ["--config", config, "--num-blocks", "33"])
    assert (settings.engine.num_blocks, settings.lease_ms, settings.engine.max_num_seqs) == (33, 600, 9)
    assert settings.engine.block_size == InstanceSettings().engine.block_size == 16


def test_gateway_flag_over_env_over_file_over_default(tmp_path, monkeypatch):
    config = write_config(tmp_path, 'port = 6001\nredis_url = "redis://file:1/0"\nmax_n = 3\n'
                                    'api_key = ["k1", "k2"]\nprefer_colocated = true\n')
    monkeypatch.setenv("PDSERVE_PORT", "6002")
    monkeypatch.setenv("PDSERVE_MAX_N", "4")
    settings = gateway_settings(["--config", config, "--max-n", "5"])
    assert (settings.port, settings.redis_url, settings.max_n, settings.limits.max_n) == (6002, "redis://file:1/0", 5, 5)
    assert (settings.api_key, settings.prefer_colocated) == (("k1", "k2"), True)
    assert settings.lease_s == GatewaySettings().lease_s


def test_planner_and_up_share_one_file(tmp_path, monkeypatch):
    config = write_config(tmp_path, "num_decode = 3\nmax_decode = 7\nttft_slo = 1.5\nitl_slo = 0.1\n")
    monkeypatch.setenv("PDSERVE_PLANNER_TTFT_SLO", "1.0")
    args = cli_parser().parse_args(["up", "--config", config, "--itl-slo", "0.05"])
    assert stack_config(args).num_decode == 3
    policy = planner_config(args)
    assert (policy.decode.max_replicas, policy.ttft_slo_s, policy.itl_slo_s) == (7, 1.0, 0.05)


def test_up_takes_the_engines_settings_under_the_instances_variables(tmp_path, monkeypatch):
    """`pdserve up`'s engine settings are EngineArgs fields (the engine's own checks), read from the
    variables the instances read too (and PDSERVE_UP_GPU_MEMORY_UTILIZATION), passed on to every instance."""
    monkeypatch.setenv("PDSERVE_MODEL", "/models/x")
    monkeypatch.setenv("PDSERVE_UP_GPU_MEMORY_UTILIZATION", "0.5")
    config = write_config(tmp_path, 'dtype = "float32"\ntensor_parallel_size = 2\n')
    stack = stack_config(cli_parser().parse_args(["up", "--config", config, "--device", "cpu", "--num-threads", "3"]))
    assert (stack.model, stack.dtype, stack.num_threads, stack.deterministic) == ("/models/x", "float32", 3, False)
    assert stack.extra_args["instance"] == ["--tensor-parallel-size=2", "--device=cpu", "--gpu-memory-utilization=0.5"]
    monkeypatch.delenv("PDSERVE_MODEL")
    monkeypatch.delenv("PDSERVE_UP_GPU_MEMORY_UTILIZATION")
    stack = stack_config(cli_parser().parse_args(["up"]))
    assert (stack.model, stack.dtype, stack.num_threads, stack.extra_args["instance"]) == (None, "bfloat16", None, [])
    with pytest.raises(ConfigurationError, match="^gpu_memory_utilization: Input should be less than or equal to 1"):
        stack_config(cli_parser().parse_args(["up", "--gpu-memory-utilization", "1.5"]))


def test_planner_service_reads_shared_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("PDSERVE_REDIS_URL", "redis://shared:1/0")
    monkeypatch.setenv("PDSERVE_PLANNER_GATEWAY_METRICS_URLS", "http://a/metrics http://b/metrics")
    from services.planner.main import PlannerServiceSettings
    from services.settings.flags import settings_from_args

    args = planner_parser().parse_args(["--profile", "p.json"])
    settings = settings_from_args(args, PlannerServiceSettings)
    assert settings.redis_url == "redis://shared:1/0"
    assert settings.gateway_metrics_url == ("http://a/metrics", "http://b/metrics")


@pytest.mark.parametrize("argv, variables, file_text, message", [
    (["--grpc-port", "70000"], {}, "", "--grpc-port: Input should be less than or equal to 65535"),
    ([], {"PDSERVE_NUM_BLOCKS": "many"}, "", "--num-blocks: Input should be a valid integer"),
    ([], {}, 'dtype = "int8"\n', "--dtype: Input should be 'bfloat16'"),
    ([], {}, "num_blockz = 3\n", "--num-blockz: is not a setting (in "),
    ([], {}, "num_blocks = \n", "--config: "),
    (["--heartbeat-interval-s", "2", "--heartbeat-ttl-s", "1"], {}, "", "--heartbeat-ttl-s: must exceed"),
    (["--deployment", "a:b"], {}, "", "--deployment: must be"),
    ([], {"PDSERVE_ROLE": "prefill"}, "", "--role: must be one of decode, colocated here, got 'prefill'"),
])
def test_a_bad_instance_setting_is_named(tmp_path, monkeypatch, capsys, argv, variables, file_text, message):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    if file_text:
        argv = [*argv, "--config", write_config(tmp_path, file_text)]
    with pytest.raises(SystemExit) as exited:
        instance_settings("x", ROLES, argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_settings_file_is_named(capsys):
    with pytest.raises(SystemExit):
        instance_settings("x", ROLES, ["--config", "/nonexistent/settings.toml"])
    assert "--config: no settings file at /nonexistent/settings.toml" in capsys.readouterr().err


def test_bad_gateway_and_planner_settings_exit_2_naming_them(tmp_path, monkeypatch, capsys):
    from services.gateway.__main__ import main as gateway_main

    monkeypatch.setenv("PDSERVE_LEASE_S", "long")
    assert gateway_main([]) == 2
    assert "--lease-s: Input should be a valid number" in capsys.readouterr().err
    assert planner_main([]) == 2
    assert "--profile: is required" in capsys.readouterr().err
    assert planner_main(["--profile", "p.json", "--metrics-port", "-5"]) == 2
    assert "--metrics-port: Input should be greater than or equal to -1" in capsys.readouterr().err


def test_secrets_are_never_echoed(monkeypatch):
    with pytest.raises(ConfigurationError) as error:
        GatewaySettings(api_key=[["not", "a", "string"]])
    assert error.value.field == "api_key" and "not" not in str(error.value)


def test_direct_construction_reads_no_environment(monkeypatch):
    monkeypatch.setenv("PDSERVE_NUM_BLOCKS", "5")
    monkeypatch.setenv("PDSERVE_PORT", "7")
    assert InstanceSettings().engine.num_blocks == 0
    assert GatewaySettings().port == 50051
    with pytest.raises(ConfigurationError, match="^num_blocks: Input should be greater than or equal to 0"):
        InstanceSettings(num_blocks=-1)


def test_every_setting_is_a_flag_with_its_variable_in_the_help():
    parser = argparse.ArgumentParser()
    from services.gateway.settings import add_arguments

    add_arguments(parser)
    text = parser.format_help()
    for name in GatewaySettings.model_fields:
        assert f"--{name.replace('_', '-')}" in text
        assert GatewaySettings.env_name(name) in text.replace("\n", "").replace(" ", "")
    assert "--config FILE" in text
