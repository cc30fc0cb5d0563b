"""Project-wide pytest fixtures. Only the real-Redis fixture lives here."""

import os
import shutil

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
