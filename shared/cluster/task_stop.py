"""Stopping a background task in bounded time, even when a cancel is lost.

`task.cancel()` followed by an unbounded `await task` hangs forever if the cancellation never
reaches the task's loop. With redis-py 8.1 on Python 3.11 it sometimes does not: a loop of
Redis commands, cancelled at a random moment, went on looping in 7 to 27 of 200 tries (a
measured reproduction, against a live redis-server). In the 60-minute chaos benchmark this
left a SIGTERMed decode instance draining forever: its prefix-tier publisher kept running,
the shutdown awaited it, and the instance never exited. So every loop that talks to Redis is
stopped with `stop_task`: cancel, wait a little, cancel again, and give up (logged) after a
bound instead of hanging the shutdown.
"""

import asyncio
import logging

logger = logging.getLogger(__name__)

RECANCEL_INTERVAL_S = 0.25
STOP_TIMEOUT_S = 5.0


async def stop_task(task: asyncio.Task | None, what: str, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Cancel `task` until it ends, for at most `timeout_s`; True if it ended. A task that
    outlives the bound is left behind (logged): the caller's shutdown goes on without it."""
    if task is None or task.done():
        _retrieve(task)
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not task.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            logger.warning("%s did not stop within %.1f s of being cancelled; going on without it",
                           what, timeout_s)
            return False
        task.cancel()
        await asyncio.wait({task}, timeout=min(RECANCEL_INTERVAL_S, remaining))
    _retrieve(task)
    return True


def _retrieve(task: asyncio.Task | None) -> None:
    """Read a finished task's outcome so asyncio does not log 'exception was never retrieved'."""
    if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
        logger.warning("background task ended with %r", task.exception())
