"""Memory pressure on running processes: move a process tree into a memory cgroup of its own
(a child of this process's cgroup) with a limit near the tree's working set, then lift the
limit and move the processes back.

cgroup v1 (`/sys/fs/cgroup/memory`) charges pages already in use to the new group when
`memory.move_charge_at_immigrate` is 3, so the group's usage starts at the tree's working set and
the limit bites at once; the kernel then reclaims the tree's page cache and, when that is not
enough, its OOM killer kills the tree's largest process (the engine core). cgroup v2 (a unified
hierarchy with a memory controller) does the same with `memory.max`; it never moves charges, so
there the limit applies to the tree's new allocations. Needs root.
"""

import contextlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup/unified")
MOVE_ANON_AND_FILE_PAGES = "3"


@dataclass
class MemoryLimit:
    """A cgroup holding some processes under a memory limit; `lift()` undoes it (idempotent)."""

    path: Path
    home: Path  # the cgroup the processes came from
    is_v1: bool
    limit_bytes: int
    start_usage_bytes: int

    def usage_bytes(self) -> int:
        return _read_int(self.path / ("memory.usage_in_bytes" if self.is_v1 else "memory.current"))

    def num_oom_kills(self) -> int:
        """OOM kills in the group so far (v1: memory.oom_control's oom_kill; v2: memory.events)."""
        name = "memory.oom_control" if self.is_v1 else "memory.events"
        with contextlib.suppress(OSError):
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def lift(self) -> None:
        if not self.path.exists():
            return
        with contextlib.suppress(OSError):
            (self.path / ("memory.limit_in_bytes" if self.is_v1 else "memory.max")).write_text(
                "-1" if self.is_v1 else "max")
        for pid in _pids(self.path):
            with contextlib.suppress(OSError):  # exited meanwhile
                (self.home / "cgroup.procs").write_text(str(pid))
        with contextlib.suppress(OSError):
            self.path.rmdir()


def own_memory_cgroup() -> tuple[Path, bool]:
    """(this process's memory cgroup directory, is cgroup v1)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, relative = line.split(":", 2)
        if "memory" in controllers.split(",") and V1_ROOT.is_dir():
            return V1_ROOT / relative.lstrip("/"), True
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, relative = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            root = V2_ROOT if (V2_ROOT / "cgroup.controllers").exists() else Path("/sys/fs/cgroup")
            return root / relative.lstrip("/"), False
    raise OSError("no memory cgroup found in /proc/self/cgroup")


def limit_memory(pids: list[int], headroom_ratio: float, name: str = "pdserve-chaos") -> MemoryLimit:
    """Move `pids` into a new memory cgroup whose limit is their working set times `headroom_ratio`
    (below 1: under it, so pages must be reclaimed or a process killed)."""
    home, is_v1 = own_memory_cgroup()
    path = home / f"{name}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        if is_v1:
            (path / "memory.move_charge_at_immigrate").write_text(MOVE_ANON_AND_FILE_PAGES)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, OSError):
                (path / "cgroup.procs").write_text(str(pid))
        usage = _read_int(path / ("memory.usage_in_bytes" if is_v1 else "memory.current"))
        if not is_v1:
            usage = sum(_tree_resident_bytes(pid) for pid in pids)
        limit = max(16 * 1024 * 1024, int(usage * headroom_ratio))
        (path / ("memory.limit_in_bytes" if is_v1 else "memory.max")).write_text(str(limit))
    except BaseException:
        MemoryLimit(path, home, is_v1, 0, 0).lift()
        raise
    return MemoryLimit(path, home, is_v1, limit, usage)


def is_available() -> bool:
    """Root, and a memory cgroup this process may create groups under."""
    try:
        home, _ = own_memory_cgroup()
    except OSError:
        return False
    return os.geteuid() == 0 and os.access(home, os.W_OK)


def _pids(path: Path) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(line) for line in (path / "cgroup.procs").read_text().split()]
    return []


def _read_int(path: Path) -> int:
    return int(path.read_text().split()[0])


def _tree_resident_bytes(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
