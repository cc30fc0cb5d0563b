"""Give freed heap memory back to the kernel: when the engine goes idle, and under load once
the process has grown by a set amount since the last trim.

The raised malloc thresholds (shared.model.cpu_runtime) keep freed memory in the process so
busy steps reuse it without page faults; the price is that freed pages stay resident, and the
heaps fragment as prefill shapes vary. A prefill instance that is never idle would never give
any of it back, so the trimmer has two triggers:

  idle  the engine has nothing to run, ran something since the last trim, and at least
        `min_free_bytes` are free in the heaps: trim (looked at most every `idle_interval_s`)
  busy  the resident set has grown `busy_growth_bytes` since the last trim (or since the
        lowest it has been): trim (looked at most every `busy_interval_s`). Growth that is
        live memory survives the trim and becomes the new baseline, so a real leak costs at
        most one trim per `busy_growth_bytes`, never one per look.

Trimming is malloc_trim(0) (shared.memory.malloc_stats): free whole pages inside the heaps go
back to the kernel; the next steps that reuse them pay the page faults once.

`HeapTrimmer.on_loop(is_idle)` is what the engine core's loop calls on every iteration (on
the engine thread, or in the engine-core process): a clock read when it is not time to look,
mallinfo2 plus /proc/self/statm when it is.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from shared.memory.malloc_stats import malloc_free_bytes, release_free_memory
from shared.memory.process import resident_bytes

logger = logging.getLogger(__name__)

MIB = 1 << 20


@dataclass(frozen=True)
class TrimPolicy:
    """When to trim; an interval or growth of 0 turns that trigger off."""

    min_free_bytes: int = 32 * MIB  # less free than this in the heaps: nothing worth returning
    idle_interval_s: float = 10.0
    busy_growth_bytes: int = 64 * MIB
    busy_interval_s: float = 5.0


@dataclass(frozen=True)
class HeapReading:
    resident_bytes: int  # the process's RSS
    free_bytes: int  # free inside glibc's heaps (resident or not)


def read_heap() -> HeapReading | None:
    """The process's RSS and glibc's free heap bytes now (None without glibc)."""
    free_bytes = malloc_free_bytes()
    return None if free_bytes is None else HeapReading(resident_bytes(), free_bytes)


class HeapTrimmer:
    def __init__(self, policy: TrimPolicy = TrimPolicy(),
                 read: Callable[[], HeapReading | None] = read_heap,
                 trim: Callable[[], object] = release_free_memory,
                 clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self._read, self._trim, self._clock = read, trim, clock
        self.num_idle_trims = 0
        self.num_busy_trims = 0
        self.trim_seconds = 0.0  # spent inside malloc_trim, all trims together
        self._last_look = {True: float("-inf"), False: float("-inf")}  # by is_idle
        self._baseline_bytes: int | None = None  # RSS after the last trim, or the lowest seen since
        self._has_run_since_trim = False

    @property
    def num_trims(self) -> int:
        return self.num_idle_trims + self.num_busy_trims

    def on_loop(self, is_idle: bool) -> bool:
        """Called every engine-loop iteration; trims if the policy says so. True if it trimmed."""
        if not is_idle:
            self._has_run_since_trim = True
        interval = self._interval(is_idle)
        if interval is None:
            return False
        now = self._clock()
        if now - self._last_look[is_idle] < interval:
            return False
        self._last_look[is_idle] = now
        reading = self._read()
        if reading is None:
            return False
        if not self._should_trim(is_idle, reading):
            return False
        self._run_trim(is_idle, reading)
        return True

    def _interval(self, is_idle: bool) -> float | None:
        """How often to look in this state; None when this state never trims (now)."""
        policy = self.policy
        if is_idle:
            return policy.idle_interval_s if policy.idle_interval_s > 0 and self._has_run_since_trim else None
        return policy.busy_interval_s if policy.busy_growth_bytes > 0 else None

    def _should_trim(self, is_idle: bool, reading: HeapReading) -> bool:
        if self._baseline_bytes is None or reading.resident_bytes < self._baseline_bytes:
            self._baseline_bytes = reading.resident_bytes
        if reading.free_bytes < self.policy.min_free_bytes:
            return False
        return is_idle or reading.resident_bytes - self._baseline_bytes >= self.policy.busy_growth_bytes

    def _run_trim(self, is_idle: bool, before: HeapReading) -> None:
        started = time.perf_counter()
        self._trim()
        self.trim_seconds += time.perf_counter() - started
        if is_idle:
            self.num_idle_trims += 1
        else:
            self.num_busy_trims += 1
        self._has_run_since_trim = False
        after = self._read()
        self._baseline_bytes = after.resident_bytes if after is not None else before.resident_bytes
        logger.log(logging.DEBUG if is_idle else logging.INFO,  # busy trims are rare: one per growth step
                   "%s heap trim: RSS %.0f -> %.0f MiB (%.0f MiB were free in the heaps; %d busy, %d idle trims, "
                   "%.0f ms in all)", "idle" if is_idle else "busy", before.resident_bytes / MIB,
                   self._baseline_bytes / MIB, before.free_bytes / MIB, self.num_busy_trims, self.num_idle_trims,
                   self.trim_seconds * 1000)
