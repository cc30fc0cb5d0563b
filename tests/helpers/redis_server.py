"""A real, throwaway `redis-server` for tests.

The `redis_server` fixture in tests/conftest.py starts one per test on a free localhost
port, with persistence off and its working directory in a temp folder. Tests that
simulate a Redis outage call `stop()` / `start()` (or `restart()`): the server comes back
on the SAME port and empty, like a real Redis restart without persistence.
"""

import shutil
import subprocess
import tempfile
from pathlib import Path

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from services.launcher.ports import find_free_port
from services.launcher.redis_child import redis_server_argv, wait_for_ping

MISSING_SERVER_MESSAGE = (
    "redis-server is not installed (needed by the cluster-state tests); "
    "run `make setup` or `apt-get install -y redis-server`"
)


class RedisServer:
    """One redis-server child process on a fixed port."""

    def __init__(self, executable: str, port: int, work_dir: Path):
        self.executable = executable
        self.port = port
        self.work_dir = work_dir
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the server and wait until it answers PING."""
        command = redis_server_argv(self.executable, self.port, "127.0.0.1", self.work_dir,
                                    str(self.work_dir / "redis.log"))
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
        self._wait_until_ready(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) by its pid."""
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=timeout_s)
        self._process = None

    def restart(self) -> None:
        """Stop, then start again on the same port (all data is lost)."""
        self.stop()
        self.start()

    def _wait_until_ready(self, timeout_s: float) -> None:
        if wait_for_ping("127.0.0.1", self.port, timeout_s, self._check_alive):
            return
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING in {timeout_s}s")

    def _check_alive(self) -> None:
        if self._process.poll() is not None:
            raise RuntimeError(f"redis-server exited early; log:\n{self._read_log()}")

    def _read_log(self) -> str:
        log_path = self.work_dir / "redis.log"
        return log_path.read_text() if log_path.exists() else "(no log)"


def start_redis_server() -> RedisServer:
    """Start a fresh server on a free port; raises RuntimeError if redis-server is missing."""
    executable = shutil.which("redis-server")
    if executable is None:
        raise RuntimeError(MISSING_SERVER_MESSAGE)
    server = RedisServer(executable, find_free_port(), Path(tempfile.mkdtemp(prefix="redis-")))
    server.start()
    return server


# A stopped server refuses connections at once, so outage tests do not wait on these; a live
# server on a busy machine can take over a second to accept (CI failed on a 1 s connect
# timeout, 2026-12-08), so they are generous.
CLIENT_TIMEOUT_S = 10.0


def connect_async(url: str) -> redis.asyncio.Redis:
    """Async client with no retries, so an outage shows as an error at once."""
    return redis.asyncio.Redis.from_url(
        url, socket_timeout=CLIENT_TIMEOUT_S, socket_connect_timeout=CLIENT_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )
