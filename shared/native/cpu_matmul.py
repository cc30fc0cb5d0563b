"""Which dtype a bf16 model's CPU matmuls compute in.

CPUs with AVX512-BF16 or AMX run oneDNN's bf16 matmuls natively, about twice as fast as fp32.
CPUs without them (AVX-512 or AVX2 only) have oneDNN emulate bf16, converting operands inside
the kernel: measured on a 2-core Xeon with AVX-512 but no BF16 extension, SmolLM2's linear
layers ran 3-6x slower in "bf16" than the same matmuls in fp32. There a bf16 model keeps its
bf16 weights and activations but its linear layers compute in fp32 on upcast copies of the
weights (2x their memory) and round each output back to bf16.

That is numerically bf16 compute: a product of two bf16 values is exact in fp32, and oneDNN's
bf16 matmuls accumulate in fp32 too, so the two differ only in the order of the fp32 sums (the
outputs agree to the last bf16 bit for all but ~1e-4 of elements, one bf16 step apart).

`PDSERVE_CPU_MATMUL_DTYPE` = `auto` (default: the rule above), `bfloat16` or `float32` forces
a choice, e.g. to compare the two on one machine.

Deterministic mode always computes in fp32: oneDNN's bf16 kernels on CPUs with AMX or
AVX512-BF16 pick their blocking by row count, so a row's sums depend on its batch (measured on
an AMX Xeon: 2 of 6 prompts changed their greedy output in a batch of 16), while the fp32
kernels are the ones whose row invariance the tests prove on every CPU.
"""

import functools
import os
from pathlib import Path

import torch

from shared.errors import ConfigurationError

ENV_VAR = "PDSERVE_CPU_MATMUL_DTYPE"
CHOICES = {"auto": None, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
           "fp32": torch.float32}
# /proc/cpuinfo flags (x86) or features (arm64) that mean bf16 matmuls run in hardware.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_matmul_dtype(model_dtype: torch.dtype, deterministic: bool = False) -> torch.dtype:
    """The dtype the CPU's linear layers compute in for a model held in `model_dtype`."""
    if model_dtype != torch.bfloat16:
        return model_dtype
    choice = os.environ.get(ENV_VAR, "auto").strip().lower()
    if choice not in CHOICES:
        raise ConfigurationError(ENV_VAR, f"must be one of {sorted(CHOICES)}, got {choice!r}")
    forced = CHOICES[choice]
    if deterministic:
        if forced == torch.bfloat16:
            raise ConfigurationError(ENV_VAR, "deterministic mode computes bf16 models' matmuls in float32, "
                                              "not bfloat16")
        return torch.float32
    if forced is not None:
        return forced
    return torch.bfloat16 if has_native_bf16_matmul() else torch.float32


@functools.cache
def has_native_bf16_matmul() -> bool:
    """True when this CPU runs bf16 dot products in hardware (AVX512-BF16, AMX, Arm BF16)."""
    return bool(cpu_flags() & NATIVE_BF16_FLAGS)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags; without a readable cpuinfo, bf16 counts as native
    (the conservative choice: oneDNN's bf16 path, as before this module existed)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return frozenset(value.split())
    except OSError:
        pass
    return NATIVE_BF16_FLAGS
