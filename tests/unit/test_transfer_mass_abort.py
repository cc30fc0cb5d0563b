"""A mass abort of KV transfers in flight never corrupts memory (issue: a prefill died with a
segfault in Py_DECREF while 2,048 completions were aborted at once).

The cause: abandoning a transfer cancelled the tasks awaiting its UCX receives and sends,
which dropped their buffers while UCX could still write into them. Now such tasks are never
cancelled (shared.kv_transfer.ucx.inflight). The stress runs in a child process, so a crash fails the
test instead of killing pytest; it also checks that every abandoned operation drains.
"""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from shared.kv_transfer.ucx import inflight

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_cancelling_many_transfers_at_once_neither_crashes_nor_leaks():
    completed = subprocess.run([sys.executable, "-X", "faulthandler", "-m", "tests.unit.transfer_abort_stress", "12", "48"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result == {"rounds": 12, "lingering": 0}


def test_abandoned_operations_are_held_until_done_never_cancelled():
    async def scenario():
        loop = asyncio.get_running_loop()
        pending = loop.create_future()
        finished = loop.create_future()
        finished.set_exception(RuntimeError("connection reset"))
        buffer = bytearray(16)
        task = asyncio.ensure_future(_hold(buffer, pending))
        await asyncio.sleep(0)
        inflight.keep_until_done([task, finished])
        assert inflight.num_lingering() == 1 and not task.cancelled()
        pending.set_result(None)
        await task
        await asyncio.sleep(0)
        assert inflight.num_lingering() == 0
    asyncio.run(scenario())


async def _hold(buffer: bytearray, until: asyncio.Future) -> None:
    await until
    buffer[0] = 1  # the buffer is still alive when the operation ends


@pytest.fixture(autouse=True)
def no_lingering_before():
    assert inflight.num_lingering() == 0
