"""Memory pressure on running processes: move a process tree into a memory cgroup of its own
(a child of this process's cgroup) whose limit leaves it `headroom` bytes beyond what is charged
to the group at the move, then lift the limit and move the processes back.

Whether the pages the tree already uses move with it depends on the kernel: cgroup v1's
`memory.move_charge_at_immigrate` is tried (3: anonymous and file pages), but kernels from 6.x
on refuse it (EINVAL), and cgroup v2 never moves charges. Then the old pages stay charged where
they were and the limit bounds what the tree allocates from the move on: a tree that keeps
touching new pages (an engine under load) runs into it within seconds, the kernel reclaims its
new page cache and then its OOM killer kills the group's largest process (the engine core).
Needs root.
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
    start_usage_bytes: int  # charged to the group right after the move

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


def limit_memory(pids: list[int], headroom_bytes: int, name: str = "pdserve-chaos") -> MemoryLimit:
    """Move `pids` into a new memory cgroup limited to its charged usage plus `headroom_bytes`."""
    home, is_v1 = own_memory_cgroup()
    path = home / f"{name}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        if is_v1:
            with contextlib.suppress(OSError):  # refused by newer kernels: charges stay behind
                (path / "memory.move_charge_at_immigrate").write_text(MOVE_ANON_AND_FILE_PAGES)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, OSError):
                (path / "cgroup.procs").write_text(str(pid))
        usage = _read_int(path / ("memory.usage_in_bytes" if is_v1 else "memory.current"))
        limit = usage + headroom_bytes
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
