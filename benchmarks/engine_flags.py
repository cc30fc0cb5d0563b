"""The engine flags every benchmark shares: model, dtype, device, parallel sizes and threads.

Each is a field of shared.engine_args.EngineArgs under an instance's flag name (`--model`,
`--dtype`, `--device`, `--tensor-parallel-size`, `--pipeline-parallel-size`, `--num-threads`),
with the field's type, choices and description, so a benchmark's engine is configured the way
`LLM(...)`, `pdserve offline` and the instances are. A benchmark declares the ones it uses:

    add_engine_arguments(parser, "model", "dtype", num_threads=2)   # its own default for one
    llm = LLM.from_engine_args(engine_args_from(args, num_blocks=64))
"""

import argparse
from typing import Any

from shared.engine_args import EngineArgs

from services.settings.engine_flags import add_engine_flags
from services.settings.engine_flags import engine_args_from as _engine_args_from

BENCH_ENGINE_FLAGS = ("model", "dtype", "device", "tensor_parallel_size", "pipeline_parallel_size", "num_threads")
# --model left out is None (the packaged model) for the benchmarks' helpers that take a model path.
BENCH_DEFAULTS = {"model": None}
# The dtypes' full names only: benchmarks hand --dtype to transformers, vLLM and torch too.
BENCH_CHOICES = {"dtype": ("bfloat16", "float32")}


def add_engine_arguments(parser: argparse.ArgumentParser, *names: str, **defaults: Any) -> None:
    """Flags for `names` (default: all of BENCH_ENGINE_FLAGS); `defaults` are this benchmark's
    own defaults where they differ from the engine's."""
    unknown = sorted(set(names) - set(BENCH_ENGINE_FLAGS))
    if unknown:
        raise ValueError(f"{unknown[0]} is not one of the benchmarks' engine flags {BENCH_ENGINE_FLAGS}")
    add_engine_flags(parser, names or BENCH_ENGINE_FLAGS, choices=BENCH_CHOICES, **{**BENCH_DEFAULTS, **defaults})


def engine_args_from(namespace: argparse.Namespace, **overrides: Any) -> EngineArgs:
    """EngineArgs from the engine flags this benchmark declared, then `overrides` (other
    EngineArgs fields, e.g. num_blocks)."""
    return _engine_args_from(namespace, **overrides)
