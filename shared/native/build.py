"""Compile a C++ source into a shared library once per machine and cache it.

`load_library(source, wrap, fallback)` is what kernel loaders call (shared/attention/native_decode.py,
shared/model/cpu_layer_ops.py); `shared_library(source)` builds or finds the file. The
library is built with the system C++ compiler (`$CXX`, else g++) for this CPU (-march=native)
and cached under `<pdserve cache dir>/kernels/` keyed by the source text (and the headers beside
it), the flags, the compiler
and the CPU's feature flags, so a source edit, a different compiler or a different machine
sharing the home folder gets its own build. Concurrent builders each write a private temporary
file and rename it into place. Any failure is logged and returns None: callers fall back to
their torch implementation.

Where `$PDSERVE_PREBUILT_KERNELS` names a folder (the container image sets it; it has no
compiler), the library comes from there instead: `python -m shared.native.prebuild` filled it
with builds for generic CPU targets (shared/native/targets.py), and the best one this CPU runs
is used. A prebuilt library is found by the digest of its source, the headers beside it and
its flags, so one built from another version of the source is never loaded.
"""

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from shared.cache_dir import pdserve_cache_dir
from shared.native.targets import Target, cpu_flags, runnable_targets

logger = logging.getLogger(__name__)

DISABLE_ENV_VAR = "PDSERVE_NATIVE_KERNELS"
PREBUILT_DIR_ENV_VAR = "PDSERVE_PREBUILT_KERNELS"
COMPILE_TIMEOUT_S = 120


def compile_flags(target_flags: tuple[str, ...]) -> tuple[str, ...]:
    return ("-O3", *target_flags, "-fopenmp", "-fno-math-errno", "-shared", "-fPIC", "-std=c++17")


COMPILE_FLAGS = compile_flags(("-march=native",))


def native_kernels_enabled() -> bool:
    return os.environ.get(DISABLE_ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


Wrapper = TypeVar("Wrapper")


def load_library(source: Path, wrap: Callable[[ctypes.CDLL], Wrapper], fallback: str) -> Wrapper | None:
    """`wrap(the loaded library)` for `source`; None when native kernels are disabled
    (PDSERVE_NATIVE_KERNELS=0) or the library cannot be built or loaded, logging that
    `fallback` ("decode attention falls back to torch") happens instead."""
    if not native_kernels_enabled():
        return None
    library_path = shared_library(source)
    if library_path is None:
        return None
    try:
        return wrap(ctypes.CDLL(str(library_path)))
    except (OSError, AttributeError) as error:
        logger.warning("Loading %s failed (%s); %s", library_path, error, fallback)
        return None


def shared_library(source: Path) -> Path | None:
    """The compiled library for `source`: a prebuilt one when $PDSERVE_PREBUILT_KERNELS has one
    for this CPU, else this machine's build (made now if it has none yet)."""
    prebuilt = prebuilt_library(source)
    if prebuilt is not None:
        return prebuilt
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


def prebuilt_name(source: Path, target: Target) -> str:
    """`<stem>-<target>-<digest of the source, its headers and the flags>.so`."""
    digest = _source_digest(source)
    digest.update(" ".join(compile_flags(target.flags)).encode())
    return f"{source.stem}-{target.name}-{digest.hexdigest()[:16]}.so"


def prebuild(compiler: str, source: Path, target: Target, out_dir: Path) -> Path:
    """Build `source` for `target` into `out_dir`; raises on failure."""
    library = out_dir / prebuilt_name(source, target)
    _compile(compiler, source, library, compile_flags(target.flags))
    return library


def prebuilt_library(source: Path) -> Path | None:
    """The best prebuilt library for this CPU, or None (no folder configured, or none fits)."""
    folder = os.environ.get(PREBUILT_DIR_ENV_VAR, "").strip()
    if not folder:
        return None
    for target in runnable_targets(cpu_flags()):
        library = Path(folder) / prebuilt_name(source, target)
        if library.is_file():
            logger.info("Using %s prebuilt for %s", source.name, target.name)
            return library
    logger.warning("%s has no build of %s for this CPU", folder, source.name)
    return None


def _compile(compiler: str, source: Path, target: Path, flags: tuple[str, ...] = COMPILE_FLAGS) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        scratch_target = Path(scratch) / target.name
        command = [compiler, *flags, "-o", str(scratch_target), str(source)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if result.returncode != 0:
            raise subprocess.SubprocessError(result.stderr.strip()[-2000:])
        os.replace(scratch_target, target)
    logger.info("Built %s", target)


def _source_digest(source: Path):
    digest = hashlib.sha256(source.read_bytes())
    for header in sorted(source.parent.glob("*.h")):  # what the source may include
        digest.update(header.name.encode())
        digest.update(header.read_bytes())
    return digest


def _build_key(source: Path, compiler: str) -> str:
    digest = _source_digest(source)
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
