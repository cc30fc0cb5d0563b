"""One child process of the stack: its command, log file, ready file and lifetime."""

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
# Linux sends the parent-death signal when the *thread* that forked a child exits, so every
# child is forked by this one thread, which lives as long as the launcher: restarts and scale-
# outs may then run on short-lived threads.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spawner")


def _load_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None


# Resolved here, in the parent: loading a library in the forked child takes the dynamic
# loader's lock, which another thread of a multithreaded parent may have held at fork time;
# the child then never reaches exec and Popen waits forever (seen in the unit suite under load).
_PRCTL = _load_prctl()


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it if the launcher dies (Linux only)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _pin_and_die_with_parent(cpus: tuple[int, ...]) -> Callable[[], None]:
    """A preexec function that also pins the child (and its threads) to `cpus`."""
    def prepare() -> None:
        _die_with_parent()
        os.sched_setaffinity(0, cpus)
    return prepare


def _launch_wrappers(cpus: tuple[int, ...] | None) -> tuple[list[str], Callable[[], None] | None]:
    """(argv prefix, preexec function) that set the parent-death signal and pin the child.

    util-linux's `setpriv --pdeathsig` and `taskset` do it in the child without Python code
    between fork and exec (which can abort or deadlock in the forked copy of a launcher that
    runs threads); without them a preexec function does it."""
    setpriv, taskset = shutil.which("setpriv"), shutil.which("taskset")
    if setpriv is None or (cpus and taskset is None):
        return [], _pin_and_die_with_parent(cpus) if cpus else _die_with_parent
    prefix = [setpriv, "--pdeathsig", "TERM"]
    if cpus:
        prefix += [taskset, "-c", ",".join(str(cpu) for cpu in cpus)]
    return prefix, None


class ChildProcess:
    """A named child with its own session (so a terminal Ctrl-C reaches only the launcher,
    which then stops the children in order), stdout+stderr in `log_path`."""

    def __init__(self, name: str, role: str, argv: Sequence[str], log_path: Path,
                 ready_file: Path | None = None, env: dict[str, str] | None = None,
                 cpus: Sequence[int] | None = None):
        self.name = name
        self.role = role
        self.argv = list(argv)
        self.log_path = log_path
        self.ready_file = ready_file
        self.env = env
        # CPU ids the child is pinned to (os.sched_setaffinity before exec); None: any.
        self.cpus = tuple(cpus) if cpus else None
        self.process: subprocess.Popen | None = None
        self.expected_exit = False

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self) -> None:
        if self.ready_file is not None:
            self.ready_file.unlink(missing_ok=True)
        self.expected_exit = False
        self.process = _SPAWNER.submit(self._spawn).result()
        logger.info("started %s (pid %d): %s", self.name, self.process.pid, " ".join(self.argv))

    def _spawn(self) -> subprocess.Popen:
        prefix, preexec_fn = _launch_wrappers(self.cpus)
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                prefix + self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, start_new_session=True, preexec_fn=preexec_fn,
            )

    def exit_code(self) -> int | None:
        """None while running (or never started); the exit status once it has exited."""
        return None if self.process is None else self.process.poll()

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def send_signal(self, signum: int) -> None:
        """Signal this child by its pid (no-op once it has exited)."""
        if self.is_running():
            self.process.send_signal(signum)

    def wait(self, timeout_s: float) -> bool:
        """True once exited, False if still running after `timeout_s`."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=max(0.0, timeout_s))
            return True
        except subprocess.TimeoutExpired:
            return False

    def log_tail(self, num_lines: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-num_lines:])


def stop_children(children: Sequence[ChildProcess], grace_s: float) -> None:
    """SIGTERM all at once, wait up to `grace_s` for all together, then SIGKILL the rest."""
    running = [child for child in children if child.is_running()]
    for child in running:
        child.expected_exit = True
        child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in running:
        if not child.wait(deadline - time.monotonic()):
            logger.warning("%s (pid %s) ignored SIGTERM for %.0f s; sending SIGKILL",
                           child.name, child.pid, grace_s)
            child.send_signal(signal.SIGKILL)
            child.wait(5.0)
