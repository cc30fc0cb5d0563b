"""Compile a C++ source into a shared library once per machine and cache it.

`shared_library(source)` is called by kernel loaders (shared/attention/native_decode.py). The
library is built with the system C++ compiler (`$CXX`, else g++) for this CPU (-march=native)
and cached under `<pdserve cache dir>/kernels/` keyed by the source text (and the headers beside
it), the flags, the compiler
and the CPU's feature flags, so a source edit, a different compiler or a different machine
sharing the home folder gets its own build. Concurrent builders each write a private temporary
file and rename it into place. Any failure is logged and returns None: callers fall back to
their torch implementation.
"""

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from shared.cache_dir import pdserve_cache_dir

logger = logging.getLogger(__name__)

DISABLE_ENV_VAR = "PDSERVE_NATIVE_KERNELS"
COMPILE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC", "-std=c++17")
COMPILE_TIMEOUT_S = 120


def native_kernels_enabled() -> bool:
    return os.environ.get(DISABLE_ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def shared_library(source: Path) -> Path | None:
    """The compiled library for `source`, building it if this machine has none yet."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        logger.warning("No C++ compiler found; %s falls back to torch", source.name)
        return None
    target = pdserve_cache_dir() / "kernels" / f"{source.stem}-{_build_key(source, compiler)}.so"
    if target.exists():
        return target
    try:
        _compile(compiler, source, target)
    except (OSError, subprocess.SubprocessError) as error:
        logger.warning("Building %s failed (%s); falling back to torch", source.name, error)
        return None
    return target


def _compile(compiler: str, source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        scratch_target = Path(scratch) / target.name
        command = [compiler, *COMPILE_FLAGS, "-o", str(scratch_target), str(source)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if result.returncode != 0:
            raise subprocess.SubprocessError(result.stderr.strip()[-2000:])
        os.replace(scratch_target, target)
    logger.info("Built %s", target)


def _build_key(source: Path, compiler: str) -> str:
    digest = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.glob("*.h")):  # what the source may include
        digest.update(header.name.encode())
        digest.update(header.read_bytes())
    digest.update(" ".join(COMPILE_FLAGS).encode())
    digest.update(_compiler_version(compiler).encode())
    digest.update(_cpu_flags().encode())
    return digest.hexdigest()[:16]


def _compiler_version(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return compiler


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine
