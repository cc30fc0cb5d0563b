"""The benchmarks' shared engine flags (benchmarks/engine_flags.py): one argument set for model,
dtype, device, parallel sizes and threads, each an EngineArgs field under an instance's flag name."""

import argparse
import re
from pathlib import Path

import pytest

from benchmarks.engine_flags import BENCH_ENGINE_FLAGS, add_engine_arguments, engine_args_from
from benchmarks.lora import build_parser as lora_parser
from shared.engine_args import EngineArgs
from shared.errors import ConfigurationError

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# A kernel microbenchmark whose --dtype includes float16, a kernel dtype no engine takes.
KERNEL_ONLY = {"decode_bandwidth.py"}


def test_a_benchmark_parser_gives_engine_args():
    args = lora_parser().parse_args(["--dtype", "float32", "--num-threads", "3", "--rank", "8"])
    assert (args.model, args.dtype, args.num_threads, args.rank) == (None, "float32", 3, 8)
    assert engine_args_from(args, num_blocks=64) == EngineArgs(dtype="float32", num_threads=3, num_blocks=64)


def test_the_whole_set_and_a_benchmarks_own_defaults():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, device="cpu", num_threads=2)
    args = parser.parse_args(["--tensor-parallel-size", "2"])
    assert {name: getattr(args, name) for name in BENCH_ENGINE_FLAGS} == {
        "model": None, "dtype": "bfloat16", "device": "cpu", "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1, "num_threads": 2}
    with pytest.raises(SystemExit):
        parser.parse_args(["--dtype", "int8"])
    with pytest.raises(ConfigurationError, match="^tensor_parallel_size"):
        engine_args_from(parser.parse_args(["--tensor-parallel-size", "0"]))
    with pytest.raises(ValueError, match="block_size is not one of"):
        add_engine_arguments(argparse.ArgumentParser(), "block_size")


def test_no_benchmark_declares_these_flags_by_hand():
    hand_written = re.compile(r'add_argument\(\s*"--(model|dtype|device|num-threads|threads|tensor-parallel-size|'
                              r'pipeline-parallel-size)"')
    offenders = [path.name for path in BENCHMARKS.rglob("*.py")
                 if path.name not in KERNEL_ONLY and hand_written.search(path.read_text())]
    assert offenders == []
