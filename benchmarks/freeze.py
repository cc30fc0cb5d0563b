"""Freezing instances (SIGSTOP of a process and its descendants: a hung host, as far as its peers
can tell), for tests that need a process alive but not running at a chosen moment, instead of
hoping it is slow enough. The fault benchmarks stop a tree through benchmarks.chaos_faults,
which also verifies the stop."""

import contextlib
import os
import signal
from pathlib import Path


def process_tree(pid: int) -> list[int]:
    """The process and its descendants (the engine-core child, workers), from /proc."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(child) for child in (task / "children").read_text().split()]
    return [pid] + [p for child in children for p in process_tree(child)]


class Frozen:
    """SIGSTOP instances' processes; SIGCONT them on leaving, whatever happened."""

    def __init__(self, *instances):
        self.pids = [pid for instance in instances for pid in process_tree(instance.pid)]

    def __enter__(self):
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)
        return self

    def thaw(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):  # killed meanwhile
                os.kill(pid, signal.SIGCONT)
        self.pids = []

    def __exit__(self, *exc):
        self.thaw()
