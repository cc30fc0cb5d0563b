"""The arena's lock, taken with patience: a tier is a cache, so waiting on it must stay bounded.

Every process of a host shares its host tier under one `flock`. A process stopped while it holds
the lock (SIGSTOP, a debugger, a frozen container) would otherwise stall every other instance
of the host at its next lookup: a decode instance then answered no Reserve for 40 s while a
prefill instance was stopped (2026-12-08). Here the lock is given up after `patience_s`
(`ArenaBusy`, which the tier manager counts and treats as a miss or a skipped store). After a
wait that ran out, later attempts make one try each without waiting until the lock is taken
again, so a holder stopped for minutes costs the others one wait, not one per lookup.
"""

import contextlib
import fcntl
import threading
import time
from collections.abc import Iterator

# Long enough for any critical section of a running holder (index changes, a run of block
# copies) on a loaded 2-core machine; short enough that a lookup never stalls a step for long.
DEFAULT_PATIENCE_S = 0.25
_FIRST_POLL_S = 0.0005
_LONGEST_POLL_S = 0.01


class ArenaBusy(RuntimeError):
    """The arena's lock was not free within the patience: another holder is stopped or slow."""


class PatientLock:
    """A thread lock inside the process and an exclusive `flock` on `fd` across processes."""

    def __init__(self, fd: int, patience_s: float = DEFAULT_PATIENCE_S):
        self.fd = fd
        self.patience_s = patience_s
        self.num_gave_up = 0
        self.thread_lock = threading.Lock()
        self._holder_seems_stuck = False

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Both locks, or ArenaBusy once the patience ran out (at once while the last wait did)."""
        patience_s = 0.0 if self._holder_seems_stuck else self.patience_s
        deadline = time.monotonic() + patience_s
        if not self._take_thread_lock(patience_s):
            self._gave_up()
        try:
            if self.fd < 0:
                raise RuntimeError("the KV arena is closed")
            self._take_file_lock(deadline)
            self._holder_seems_stuck = False
            try:
                yield
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self.thread_lock.release()

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """Both locks, waiting as long as it takes (for opening the arena)."""
        with self.thread_lock:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _take_thread_lock(self, patience_s: float) -> bool:
        if patience_s > 0:
            return self.thread_lock.acquire(timeout=patience_s)
        return self.thread_lock.acquire(blocking=False)

    def _take_file_lock(self, deadline: float) -> None:
        poll_s = _FIRST_POLL_S
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._gave_up()
                time.sleep(min(poll_s, remaining))
                poll_s = min(poll_s * 2, _LONGEST_POLL_S)

    def _gave_up(self) -> None:
        self.num_gave_up += 1
        self._holder_seems_stuck = True
        raise ArenaBusy(f"the KV arena's lock was held by another holder for over {self.patience_s:g} s")
