"""Keeping a UCX operation's buffer alive until UCX is done with it.

A ucxx send or receive hands UCX a raw pointer into a Python buffer; the buffer stays alive
only while the coroutine awaiting the operation holds it. Cancelling that coroutine's task
drops the buffer at once, yet UCX may still complete the operation later (a receive the
worker took over, an endpoint whose abort timed out) and write into freed memory: heap
corruption that surfaces far away, e.g. as a segfault in Py_DECREF during a mass abort.

So a transfer that gives up never cancels such a task: it aborts the endpoint (which makes
UCX finish or cancel every pending operation) and hands the tasks to `keep_until_done`,
which holds them, and through them their buffers, until each completes.
"""

import asyncio
from collections.abc import Iterable

_lingering: set[asyncio.Future] = set()


def keep_until_done(tasks: Iterable[asyncio.Future]) -> None:
    """Hold `tasks` (and what they reference) until they finish; their results are dropped."""
    for task in tasks:
        if task.done():
            _consume(task)
        else:
            _lingering.add(task)
            task.add_done_callback(_release)


def num_lingering() -> int:
    """How many UCX operations of abandoned transfers are still pending (tests, metrics)."""
    return len(_lingering)


def _release(task: asyncio.Future) -> None:
    _lingering.discard(task)
    _consume(task)


def _consume(task: asyncio.Future) -> None:
    """Mark the outcome as seen (no "exception never retrieved" warning)."""
    if not task.cancelled():
        task.exception()
