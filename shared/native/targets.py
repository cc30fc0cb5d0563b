"""CPU targets a kernel can be prebuilt for, and which one a CPU runs best.

A machine with a C++ compiler builds each kernel for its own CPU (`-march=native`, see
shared/native/build.py). An image without a compiler (deploy/compose/Dockerfile) carries the
kernels prebuilt for a few generic targets instead, one per code path the kernels have
(portable C++, AVX2, AVX-512, AVX-512 with BF16 dot products, AMX tiles); at load time the
best target whose instructions this CPU has is chosen from its /proc/cpuinfo flags.
"""

import platform
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    name: str
    flags: tuple[str, ...]  # compiler flags selecting the instruction set
    cpu_flags: frozenset[str]  # /proc/cpuinfo flags the CPU must have to run it


_X86_64_V3_FLAGS = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})
_X86_64_V4_FLAGS = _X86_64_V3_FLAGS | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}

# Best first. The psABI levels (x86-64, -v3, -v4) are what GCC >= 11 and Clang >= 12 call them.
TARGETS_BY_MACHINE: dict[str, tuple[Target, ...]] = {
    "x86_64": (
        Target("x86-64-v4-amx", ("-march=x86-64-v4", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"),
               _X86_64_V4_FLAGS | {"avx512_bf16", "amx_tile", "amx_bf16"}),
        Target("x86-64-v4-bf16", ("-march=x86-64-v4", "-mavx512bf16"), _X86_64_V4_FLAGS | {"avx512_bf16"}),
        Target("x86-64-v4", ("-march=x86-64-v4",), _X86_64_V4_FLAGS),
        Target("x86-64-v3", ("-march=x86-64-v3",), _X86_64_V3_FLAGS),
        Target("x86-64", ("-march=x86-64",), frozenset()),
    ),
    # The compiler's default target (armv8-a): the kernel's portable path.
    "aarch64": (Target("generic", (), frozenset()),),
}


def machine_targets(machine: str | None = None) -> tuple[Target, ...]:
    """The targets for this (or the given) machine architecture; () when pdserve has none."""
    return TARGETS_BY_MACHINE.get(machine or platform.machine(), ())


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags ("flags" on x86, "Features" on ARM); empty if unknown."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return frozenset()
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def runnable_targets(flags: frozenset[str], machine: str | None = None) -> list[Target]:
    """The targets a CPU with `flags` can run, best first."""
    return [target for target in machine_targets(machine) if target.cpu_flags <= flags]
