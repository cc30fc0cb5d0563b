"""Tensor/pipeline parallel sizes through every front door: instance flags and PDSERVE_*
variables, `pdserve up` (passed on to every instance), `pdserve offline`, and `LLM(...)`."""

import pytest

from services.instance.engine_setup import engine_config
from services.instance.flags import parse_settings
from services.cli.main import build_parser
from services.cli.up_command import config_from_args
from shared.engine_args import EngineArgs
from shared.errors import ConfigurationError


def test_instance_flags_and_variables_reach_the_engine_config(monkeypatch):
    monkeypatch.setenv("PDSERVE_PIPELINE_PARALLEL_SIZE", "2")
    settings = parse_settings("x", ("decode",), ["--tensor-parallel-size", "3"])
    parallel = engine_config(settings).parallel
    assert (parallel.tensor_parallel_size, parallel.pipeline_parallel_size, parallel.world_size) == (3, 2, 6)


def test_a_bad_parallel_size_exits_2_naming_the_setting(capsys):
    with pytest.raises(SystemExit) as exited:
        parse_settings("x", ("decode",), ["--tensor-parallel-size", "0"])
    assert exited.value.code == 2
    assert "tensor-parallel-size" in capsys.readouterr().err


def test_up_passes_the_sizes_to_every_instance():
    args = build_parser().parse_args(["up", "--tensor-parallel-size", "3", "--pipeline-parallel-size", "2"])
    assert config_from_args(args).extra_args["instance"][:2] == [
        "--tensor-parallel-size=3", "--pipeline-parallel-size=2"]
    assert config_from_args(build_parser().parse_args(["up"])).extra_args["instance"] == []


def test_offline_and_llm_keywords():
    args = build_parser().parse_args(["offline", "hi", "--tensor-parallel-size", "3"])
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (3, 1)
    config = EngineArgs.from_kwargs(model=None, dtype="float32", tensor_parallel_size=3,
                                    pipeline_parallel_size=2).create_engine_config()
    assert (config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size) == (3, 2)
    with pytest.raises(ConfigurationError, match="pipeline_parallel_size"):
        EngineArgs.from_kwargs(model=None, dtype="float32", pipeline_parallel_size=-1)
