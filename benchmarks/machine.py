"""The lines every benchmark prints before its figures (and writes into its JSON): the CPU, the
flags that choose pdserve's paths, the oneDNN kernel a bf16 matmul actually ran (read from
ONEDNN_VERBOSE in a child process), and the engine's compute paths, so no figure is quoted
without the path that made it.
"""

import os
import re
import subprocess
import sys

import torch

from shared.model.compute_paths import ComputePaths
from shared.native.cpu_info import cpu_model_name, describe_cpu, onednn_bf16_engine, path_flags

# A packed bf16 linear layer as the engine runs it, to see which oneDNN implementation runs.
_PROBE = """
import torch
weight = torch.ops.mkldnn._reorder_linear_weight(torch.randn(64, 64).to(torch.bfloat16))
torch.ops.mkldnn._linear_pointwise(torch.randn(16, 64).to(torch.bfloat16), weight, None, "none", [], "")
"""
_IMPLEMENTATION = re.compile(r"primitive,exec,cpu,inner_product,([^,]+),")


def onednn_bf16_kernel() -> str:
    """The oneDNN implementation a bf16 inner product ran (e.g. brg_matmul:avx10_1_512_amx)."""
    try:
        result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
                                env=os.environ | {"ONEDNN_VERBOSE": "1"})
    except (OSError, subprocess.SubprocessError) as error:
        return f"unknown ({error})"
    found = _IMPLEMENTATION.findall(result.stdout + result.stderr)
    return found[-1] if found else "unknown (no oneDNN verbose line)"


def default_model_paths(dtype: str = "bfloat16", block_size: int = 16, deterministic: bool = False) -> ComputePaths:
    """The paths an engine on the default model takes on this machine (for benchmarks whose
    engines run in other processes)."""
    from shared.model.config import ModelConfig
    from shared.model.default_model import resolve_model
    from shared.model.describe_paths import expected_cpu_paths

    config = ModelConfig.from_folder(resolve_model(None))
    return expected_cpu_paths(config.num_heads, config.num_kv_heads, config.head_dim, getattr(torch, dtype),
                              block_size, deterministic)


def machine_report(paths: ComputePaths | None = None, probe_onednn: bool = True) -> dict:
    report = {"cpu": cpu_model_name(), "flags": path_flags(), "onednn_bf16": onednn_bf16_engine(),
              "threads": torch.get_num_threads(), "torch": torch.__version__}
    if probe_onednn:
        report["onednn_bf16_kernel"] = onednn_bf16_kernel()
    if paths is not None:
        report["paths"] = paths.summary()
    return report


def print_machine(paths: ComputePaths | None = None, probe_onednn: bool = True) -> dict:
    """Print the machine lines; returns them as a dict for the benchmark's JSON."""
    report = machine_report(paths, probe_onednn)
    print(describe_cpu() + f"; torch {report['torch']}")
    if probe_onednn:
        print(f"oneDNN bf16 matmul kernel: {report['onednn_bf16_kernel']}")
    if paths is not None:
        print(f"paths: {report['paths']}")
    return report
