"""What this CPU is and which of its matrix engines oneDNN can use: printed by every benchmark and
logged by every engine beside the kernels it runs (shared/model/compute_paths.py).

The CPU model changes from one machine to the next even within one cloud instance type, and
pdserve's fastest paths depend on it: AMX tiles and AVX512-BF16 (bf16 matmuls in hardware, the
AMX and AVX512-BF16 attention kernels), AVX-512F (the fp32-compute fallbacks), or neither.
"""

import functools
import os
from pathlib import Path

from shared.native.cpu_matmul import cpu_flags

# The flags that choose pdserve's CPU paths, in the order they are printed.
PATH_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


@functools.cache
def cpu_model_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return os.uname().machine


def path_flags() -> list[str]:
    """The PATH_FLAGS this CPU has."""
    flags = cpu_flags()
    return [flag for flag in PATH_FLAGS if flag in flags]


def onednn_bf16_engine() -> str:
    """Which hardware oneDNN's bf16 matmuls run on here: AMX, AVX512-BF16, or emulation (fp32
    arithmetic on widened bf16); ONEDNN_MAX_CPU_ISA can hold oneDNN below what the CPU has."""
    import torch

    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if torch.cpu._is_amx_tile_supported() and (not cap or "AMX" in cap or cap == "ALL"):
        return "AMX"
    if torch.cpu._is_avx512_bf16_supported() and (not cap or "BF16" in cap or "AMX" in cap or cap == "ALL"):
        return "AVX512-BF16"
    return "emulated"


def describe_cpu() -> str:
    """One line: the model, the path flags it has, and the threads torch uses."""
    import torch

    return (f"CPU {cpu_model_name()}; flags {' '.join(path_flags()) or 'none of ' + '/'.join(PATH_FLAGS)}; "
            f"oneDNN bf16 on {onednn_bf16_engine()}; {torch.get_num_threads()} threads")
