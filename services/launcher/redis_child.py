"""The stack's own redis-server: loopback only, no persistence, restartable on its port."""

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import redis

from services.launcher.child import ChildProcess, stop_children
from services.launcher.errors import StackAborted, StackError

MISSING_REDIS_MESSAGE = (
    "redis-server is not installed; run `make setup` or `apt-get install -y redis-server`"
)


def redis_server_argv(executable: str, port: int, host: str, work_dir: Path, logfile: str = "") -> list[str]:
    """redis-server on one loopback port, persistence off (a restart comes back empty)."""
    return [executable, "--port", str(port), "--bind", host, "--save", "", "--appendonly", "no",
            "--dir", str(work_dir), "--logfile", logfile]


def wait_for_ping(host: str, port: int, timeout_s: float, check_alive: Callable[[], None]) -> bool:
    """Poll until the server answers PING (True) or `timeout_s` passes (False); `check_alive`
    raises to give up early (the process died, a stop was requested)."""
    deadline = time.monotonic() + timeout_s
    client = redis.Redis(host=host, port=port, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        while time.monotonic() < deadline:
            check_alive()
            try:
                if client.ping():
                    return True
            except redis.ConnectionError:
                time.sleep(0.02)
    finally:
        client.close()
    return False


class RedisChild(ChildProcess):
    """redis-server on a fixed loopback port; `restart()` brings it back empty on that port."""

    def __init__(self, port: int, run_dir: Path, host: str = "127.0.0.1", cpus: tuple[int, ...] | None = None):
        executable = shutil.which("redis-server")
        if executable is None:
            raise StackError(MISSING_REDIS_MESSAGE)
        self.host = host
        self.port = port
        argv = redis_server_argv(executable, port, host, run_dir)
        super().__init__("redis", "redis", argv, run_dir / "logs" / "redis.log", cpus=cpus)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def wait_ready(self, timeout_s: float = 10.0, should_abort=lambda: False) -> None:
        """Block until the server answers PING."""
        if not wait_for_ping(self.host, self.port, timeout_s, lambda: self._check_alive(should_abort)):
            raise StackError(f"redis-server on port {self.port} did not answer PING in {timeout_s} s")

    def _check_alive(self, should_abort) -> None:
        if should_abort():
            raise StackAborted("stop requested while starting redis-server")
        if not self.is_running():
            raise StackError(f"redis-server exited early:\n{self.log_tail()}")

    def restart(self, down_s: float = 0.0, grace_s: float = 10.0) -> None:
        """Stop (SIGTERM, then SIGKILL), stay down `down_s`, start again on the same port."""
        stop_children([self], grace_s)
        time.sleep(down_s)
        self.start()
        self.wait_ready()
