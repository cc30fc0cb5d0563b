"""Fewer torch threads while other processes keep this engine's CPUs busy, more when they leave.

An OpenMP parallel region ends when its slowest thread does: with one of two threads
sharing its core with another busy process, every matmul and attention call waits for the
thread that runs half the time, and the step slows down more than the lost core explains.
`ThreadGovernor.maybe_adjust`, called by the model runner before each step, looks every
`interval_s` at how busy the engine's CPUs were (/proc/stat, only the CPUs in its affinity
mask) minus what this process itself used (os.times), i.e. the CPUs' worth of time other
processes took, and sets the thread count to the CPUs left (rounded, at least 1, at most
the configured count). A new count must be seen twice in a row before it is applied, so a
short burst does not make it flap. Linux only; elsewhere it does nothing.
"""

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

PROC_STAT = Path("/proc/stat")
INTERVAL_S = 0.5
# /proc/stat fields that count as busy: user nice system irq softirq steal (not idle, iowait).
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
DISABLE_VARIABLE = "PDSERVE_ADAPTIVE_THREADS"


def busy_seconds(cpus: set[int], stat_path: Path = PROC_STAT) -> float | None:
    """Busy time of `cpus` since boot, in seconds (None when /proc/stat is unreadable)."""
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    total = 0
    try:
        lines = stat_path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, values = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        fields = values.split()
        total += sum(int(fields[index]) for index in BUSY_FIELDS if index < len(fields))
    return total / ticks_per_s


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


class ThreadGovernor:
    def __init__(self, max_threads: int, cpus: set[int], interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 read_busy: Callable[[], float | None] | None = None,
                 read_own: Callable[[], float] = own_cpu_seconds,
                 set_threads: Callable[[int], None] = torch.set_num_threads):
        self.max_threads = max_threads
        self.num_threads = max_threads
        self.interval_s = interval_s
        self._clock, self._read_own, self._set_threads = clock, read_own, set_threads
        self._read_busy = read_busy or (lambda: busy_seconds(cpus))
        self._num_cpus = len(cpus)
        self._last = self._sample()
        self._pending: int | None = None

    @classmethod
    def for_this_process(cls) -> "ThreadGovernor | None":
        """A governor over torch's current thread count, or None where it cannot or should not
        work (one thread, no /proc/stat, PDSERVE_ADAPTIVE_THREADS=0)."""
        if os.environ.get(DISABLE_VARIABLE, "1") == "0" or not hasattr(os, "sched_getaffinity"):
            return None
        cpus = os.sched_getaffinity(0)
        if torch.get_num_threads() < 2 or busy_seconds(cpus) is None:
            return None
        return cls(torch.get_num_threads(), cpus)

    def maybe_adjust(self) -> int:
        """The thread count to run this step with (changed at most once per interval)."""
        now = self._clock()
        if now - self._last[0] < self.interval_s:
            return self.num_threads
        sample, last = self._sample(), self._last
        self._last = sample
        if sample[1] is None or last[1] is None or sample[0] <= last[0]:
            return self.num_threads
        wall, busy, own = (new - old for new, old in zip(sample, last))
        others = max(0.0, (busy - own) / wall)
        target = max(1, min(self.max_threads, round(self._num_cpus - others)))
        if target == self.num_threads or target != self._pending:
            self._pending = None if target == self.num_threads else target
            return self.num_threads
        logger.info("other processes use %.1f of %d CPUs: %d -> %d threads", others, self._num_cpus,
                    self.num_threads, target)
        self._set_threads(target)
        self.num_threads, self._pending = target, None
        return target

    def _sample(self) -> tuple[float, float | None, float]:
        return self._clock(), self._read_busy(), self._read_own()
