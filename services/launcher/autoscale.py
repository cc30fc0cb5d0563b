"""LocalActuator: the planner's hands in `pdserve up --autoscale`. Scale-out launches new
instance processes from one long-lived launcher thread (the planner never waits for a model
to load, and a child's parent-death signal is tied to the thread that forked it, so that
thread must outlive the children);
scale-in sends SIGTERM to the newest instances of the pool, which drain (withdraw from Redis,
finish in-flight requests) and exit. Nothing here edits the stack beyond adding children."""

import itertools
import logging
import queue
import signal
import threading
import time

from services.launcher.child import ChildProcess
from services.launcher.stack import LocalStack

logger = logging.getLogger(__name__)


class LocalActuator:
    def __init__(self, stack: LocalStack):
        self.stack = stack
        self._lock = threading.Lock()
        self._starting: dict[str, str] = {}  # name -> role of instances launched, not yet SERVING
        self._serial = itertools.count(len(stack.instances))
        self._launches: queue.Queue = queue.Queue()
        threading.Thread(target=self._launcher, name="autoscale-launcher", daemon=True).start()

    def _active(self, role: str) -> list[ChildProcess]:
        """Running, SERVING instances of the pool that were not asked to stop, oldest first."""
        return [child for child in self.stack.instances if child.role == role and child.is_running()
                and not child.expected_exit and child.name not in self._starting]

    def replicas(self, role: str) -> int:
        with self._lock:
            return len(self._active(role)) + sum(1 for starting in self._starting.values() if starting == role)

    def scale(self, role: str, replicas: int) -> None:
        current = self.replicas(role)
        if replicas > current:
            for _ in range(replicas - current):
                self._launch(role)
        for child in reversed(self._active(role)[replicas:] if replicas < current else []):
            self._drain(child)

    def _launch(self, role: str) -> None:
        name = f"{role}-{next(self._serial)}"
        with self._lock:
            self._starting[name] = role
        self._launches.put((name, role))

    def _launcher(self) -> None:
        """Starts queued instances one after another, for the life of the process."""
        while True:
            self._start_instance(*self._launches.get())

    def _start_instance(self, name: str, role: str) -> None:
        deadline = time.monotonic() + self.stack.config.ready_timeout_s
        try:
            self.stack.start_instances([(name, role)], deadline)
            logger.warning("autoscale: %s is SERVING", name)
        except Exception as error:  # noqa: BLE001 - the planner sees the pool stay short and retries
            logger.error("autoscale: starting %s failed: %s", name, error)
        finally:
            with self._lock:
                del self._starting[name]

    @staticmethod
    def _drain(child: ChildProcess) -> None:
        """SIGTERM: the instance leaves routing, finishes its requests, then exits."""
        logger.warning("autoscale: draining %s (pid %s)", child.name, child.pid)
        child.expected_exit = True
        child.send_signal(signal.SIGTERM)
