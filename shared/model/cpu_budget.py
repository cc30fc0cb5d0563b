"""How many CPUs this process may really use, and OpenMP settings that share them politely.

torch sizes its thread pool from the machine's core count, which ignores both the affinity
mask (`taskset`, a launcher's pinning) and a cgroup CPU quota (a container's `--cpus`): with
more threads than CPUs every parallel region waits at its barrier for a thread that is not
running. `cpu_budget()` is the smaller of the CPUs in the affinity mask and the cgroup quota
(cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, rounded down, at least 1);
engines use it as their default thread count unless OMP_NUM_THREADS says otherwise.

OpenMP threads that finish early spin before sleeping (libgomp: 300,000 polls by default,
a good fraction of a millisecond); beside another busy process that spinning takes the CPU the
late thread needs. pdserve bounds it (`GOMP_SPINCOUNT=20000`, tens of microseconds): long
enough to catch the next of a step's back-to-back parallel regions, short enough to give the
core away when the other thread is late. libgomp reads it once, when it loads (with torch), so
it must be in a process's environment before it imports torch: `omp_environment` gives the
variables for child processes (`pdserve up` sets them) and `prefer_bounded_spinning` sets them
in this process if torch is not loaded yet. Measured figures: docs/performance.md.
"""

import math
import os
import sys
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# libgomp's spin count before a waiting thread sleeps (its default is 300,000 polls;
# OMP_WAIT_POLICY=PASSIVE means 0, which made every region pay a futex wake-up).
DEFAULT_WAIT_POLICY = {"GOMP_SPINCOUNT": "20000"}


def allowed_cpus() -> list[int]:
    """The CPU ids this process may run on (its affinity mask)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs' worth of time the process's cgroup may use (e.g. 1.5), None when unlimited/unknown."""
    for path in _cgroup_dirs(root, proc_cgroup):
        quota = _v2_quota(path / "cpu.max")
        if quota is None:
            quota = _v1_quota(path / "cpu.cfs_quota_us", path / "cpu.cfs_period_us")
        if quota is not None:
            return quota
    return None


def cpu_budget(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """Threads that can run at once: min(affinity mask, cgroup quota rounded down), >= 1."""
    budget = len(allowed_cpus())
    quota = cgroup_cpu_quota(root, proc_cgroup)
    if quota is not None:
        budget = min(budget, math.floor(quota))
    return max(1, budget)


def default_num_threads() -> int:
    """An engine's thread count when none is configured: OMP_NUM_THREADS when the environment
    sets it (as `pdserve up` does for its instances), else `cpu_budget()`."""
    text = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(text) if text.isdigit() and int(text) > 0 else cpu_budget()


def omp_environment(num_threads: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """OMP_NUM_THREADS and the wait policy for a child process; explicit settings win."""
    environ = os.environ if environ is None else environ
    variables = {"OMP_NUM_THREADS": str(num_threads)}
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        variables.update(DEFAULT_WAIT_POLICY)
    return variables


def prefer_bounded_spinning() -> bool:
    """Set the default wait policy in this process's environment (unless one is set);
    returns False when torch was already imported, too late for it to apply."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return "torch" not in sys.modules
    if "torch" in sys.modules:
        return False
    os.environ.update(DEFAULT_WAIT_POLICY)
    return True


def _cgroup_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    """This process's cgroup folders (v2 unified path, v1 cpu controller), innermost first,
    then their parents up to the root: a quota set on a parent applies too."""
    dirs = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            dirs.append(root / path.lstrip("/"))
        elif "cpu" in controllers.split(","):
            base = next((root / name for name in ("cpu,cpuacct", "cpu") if (root / name).is_dir()), root / "cpu")
            dirs.append(base / path.lstrip("/"))
    expanded = []
    for path in dirs:
        while True:
            expanded.append(path)
            if path in (root, path.parent) or root not in path.parents:
                break
            path = path.parent
    return expanded or [root]


def _v2_quota(path: Path) -> float | None:
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period)


def _v1_quota(quota_path: Path, period_path: Path) -> float | None:
    try:
        quota, period = int(quota_path.read_text()), int(period_path.read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period
