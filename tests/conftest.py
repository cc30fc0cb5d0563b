"""Project-wide pytest fixtures and hooks: the real-Redis fixture, and the test process's exit."""

import os
import shutil
import sys

import torch

# Without a GPU the Triton kernels run under Triton's interpreter, which must be on before
# triton is first imported (transformers imports it): see tests/unit/triton_setup.py.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Instance processes a test starts get no host KV tier unless the test asks for one (the
# stacks of tests/helpers/stack.py do, in their own run directory): never a machine-sized arena
# in /dev/shm shared with other tests and runs.
os.environ.setdefault("PDSERVE_KV_HOST_TIER_GB", "0")
from collections.abc import Iterator

import pytest

from tests.helpers.redis_server import MISSING_SERVER_MESSAGE, RedisServer, start_redis_server


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh, empty redis-server for one test (`.url`, `.port`, `.restart()`)."""
    if shutil.which("redis-server") is None:
        pytest.fail(MISSING_SERVER_MESSAGE)
    server = start_redis_server()
    yield server
    server.stop()
    shutil.rmtree(server.work_dir, ignore_errors=True)


# The session's exit status, for pytest_unconfigure below.
_session_exit_status: int | None = None


def pytest_sessionfinish(session, exitstatus) -> None:
    global _session_exit_status
    _session_exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    """Once pytest has reported, the test process exits with the session's status without
    running the interpreter's finalizers. ucxx's (a listener's, at module teardown) can block
    for good: a whole `tests/unit` run printed its summary and then sat in interpreter shutdown
    for 45 minutes (2026-12-02). Every process a test started was stopped by its fixture; the
    services' own shutdown is tested separately (they do not pass through here).
    PDSERVE_TESTS_FINALIZE=1 keeps the normal exit, to look for such a hang."""
    if _session_exit_status is None or os.environ.get("PDSERVE_TESTS_FINALIZE") == "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_session_exit_status)
