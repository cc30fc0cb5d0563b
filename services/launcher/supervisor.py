"""Supervisor: keeps a LocalStack's children running until the stack is asked to stop.

A child that exits without being asked to (crash, kill -9, an instance whose engine failed)
is started again with the same command line after a backoff that doubles from
`initial_backoff_s` up to `max_backoff_s` (reset once it has stayed up `stable_s`). More than
`max_restarts` restarts within `window_s` is a crash loop: the supervisor gives up on that
child (state "failed") and the rest keep serving. Restarts run on threads of their own, so
one slow restart never delays noticing another death. `records()` is what `pdserve status`
shows (published to Redis by services.launcher.supervision_board).
"""

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from services.launcher.child import ChildProcess
from services.launcher.errors import StackError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    stable_s: float = 30.0
    max_restarts: int = 5
    window_s: float = 60.0

    def backoff_s(self, num_recent_restarts: int) -> float:
        return min(self.max_backoff_s, self.initial_backoff_s * 2 ** num_recent_restarts)


@dataclass
class ChildRecord:
    """What the supervisor knows of one child: restarts so far and its state."""

    name: str
    role: str
    num_restarts: int = 0
    state: str = "running"  # running | restarting | failed | stopped
    last_exit_code: int | None = None
    started_at: float = field(default_factory=time.monotonic)
    recent_restarts: deque = field(default_factory=deque)


class Supervisor:
    """`restart(child)` is the stack's: start the child again and wait until it serves."""

    def __init__(self, policy: RestartPolicy, restart: Callable[[ChildProcess], None],
                 clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self._restart = restart
        self._clock = clock
        self._lock = threading.Lock()
        self._records: dict[str, ChildRecord] = {}
        self._stopping = threading.Event()

    def records(self) -> list[ChildRecord]:
        with self._lock:
            return [ChildRecord(**vars(record)) for record in self._records.values()]

    def record_of(self, child: ChildProcess) -> ChildRecord:
        with self._lock:
            return self._records.setdefault(child.name, ChildRecord(child.name, child.role))

    def forget(self, name: str) -> None:
        """Stop supervising a child that was removed on purpose (scale-in)."""
        with self._lock:
            self._records.pop(name, None)

    def stop(self) -> None:
        """No more restarts (the stack is stopping)."""
        self._stopping.set()

    def is_stopping(self) -> bool:
        return self._stopping.is_set()

    def check(self, children: list[ChildProcess]) -> None:
        """One round: schedule a restart for every child that died unasked."""
        for child in children:
            record = self.record_of(child)
            if child.expected_exit or child.exit_code() is None or self._stopping.is_set():
                continue
            if record.state in ("restarting", "failed"):
                continue
            self._on_death(child, record)

    def _on_death(self, child: ChildProcess, record: ChildRecord) -> None:
        now = self._clock()
        with self._lock:
            record.last_exit_code = child.exit_code()
            if now - record.started_at >= self.policy.stable_s:
                record.recent_restarts.clear()
            while record.recent_restarts and now - record.recent_restarts[0] > self.policy.window_s:
                record.recent_restarts.popleft()
            if len(record.recent_restarts) >= self.policy.max_restarts:
                record.state = "failed"
            else:
                record.state = "restarting"
                delay_s = self.policy.backoff_s(len(record.recent_restarts))
                record.recent_restarts.append(now)
        if record.state == "failed":
            logger.error("%s crash-looped (%d restarts in %.0f s); giving up on it, last status %s:\n%s",
                         child.name, self.policy.max_restarts, self.policy.window_s,
                         record.last_exit_code, child.log_tail())
            return
        logger.warning("%s (pid %s) exited with status %s; restarting in %.1f s; last log lines:\n%s",
                       child.name, child.pid, record.last_exit_code, delay_s, child.log_tail(10))
        threading.Thread(target=self._restart_after, args=(child, record, delay_s),
                         name=f"restart-{child.name}", daemon=True).start()

    def _restart_after(self, child: ChildProcess, record: ChildRecord, delay_s: float) -> None:
        if self._stopping.wait(delay_s):
            return
        try:
            self._restart(child)
        except StackError as error:
            logger.warning("restart of %s failed: %s", child.name, error)
        except Exception:  # noqa: BLE001 - a restart thread must never die silently
            logger.exception("restart of %s failed", child.name)
        with self._lock:
            record.num_restarts += 1
            record.started_at = self._clock()
            record.state = "running"
        logger.info("%s restarted (%d restarts so far)", child.name, record.num_restarts)
