"""Memory pressure on running processes: move a process tree into a memory cgroup of its own
(a child of this process's cgroup) with a memory limit, then lift the limit and move the
processes back.

Whether the pages the tree already uses move with it depends on the kernel: cgroup v1's
`memory.move_charge_at_immigrate` is tried (3: anonymous and file pages), but kernels from 6.x
on refuse it (EINVAL), and cgroup v2 never moves charges. Then the old pages stay charged where
they were and only what the tree allocates from the move on counts against the limit; a process
the tree starts afterwards (an engine core restarted in place) is charged in full, as in a
container with a memory limit. Over the limit the kernel reclaims the group's page cache, then
its OOM killer kills the group's largest process. Needs root.
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

    def num_limit_hits(self) -> int:
        """Times an allocation met the limit (v1: memory.failcnt; v2: memory.events' max)."""
        with contextlib.suppress(OSError, ValueError):
            if self.is_v1:
                return _read_int(self.path / "memory.failcnt")
            for line in (self.path / "memory.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        return 0

    def pids(self) -> list[int]:
        """The processes in the group now (those moved in and those started inside)."""
        return _pids(self.path)

    def peak_bytes(self) -> int:
        with contextlib.suppress(OSError, ValueError):
            return _read_int(self.path / ("memory.max_usage_in_bytes" if self.is_v1 else "memory.peak"))
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


def limit_memory(pids: list[int], limit_bytes: int, name: str = "pdserve-chaos") -> MemoryLimit:
    """Move `pids` into a new memory cgroup limited to `limit_bytes` (at least what is already
    charged to it after the move)."""
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
        limit = max(limit_bytes, usage)
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


def anonymous_bytes(pid: int) -> int:
    """A process's anonymous resident memory (RssAnon): what a restart of it allocates afresh."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0
