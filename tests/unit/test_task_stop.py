"""Stopping a background loop never hangs a shutdown: a lost cancel is cancelled again, and a
loop that ignores every cancel is left behind after a bound (shared/cluster/task_stop.py)."""

import asyncio
import logging

from shared.cluster.task_stop import stop_task


async def loop_that_loses_cancels(lost: int, is_released: asyncio.Event) -> None:
    """Like a Redis loop whose client swallowed a cancellation: it goes on looping."""
    while not is_released.is_set():
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if lost == 0:
                raise
            lost -= 1


def test_a_lost_cancel_is_sent_again_until_the_loop_ends():
    async def scenario():
        task = asyncio.create_task(loop_that_loses_cancels(2, asyncio.Event()))
        await asyncio.sleep(0.02)
        assert await stop_task(task, "the test loop", timeout_s=30.0)
        assert task.cancelled()
    asyncio.run(scenario())


def test_a_loop_that_ignores_every_cancel_is_left_behind_after_the_bound(caplog):
    caplog.set_level(logging.WARNING)

    async def scenario():
        is_released = asyncio.Event()
        task = asyncio.create_task(loop_that_loses_cancels(10**9, is_released))
        await asyncio.sleep(0.02)
        assert not await stop_task(task, "the stubborn loop", timeout_s=0.3)
        assert not task.done()
        is_released.set()
        await task
    asyncio.run(scenario())
    assert "the stubborn loop did not stop within 0.3 s" in caplog.text


def test_a_finished_or_missing_task_stops_at_once_and_its_error_is_read(caplog):
    caplog.set_level(logging.WARNING)

    async def failing():
        raise RuntimeError("boom")

    async def scenario():
        task = asyncio.create_task(failing())
        await asyncio.wait({task})
        assert await stop_task(task, "a failed loop") and await stop_task(None, "nothing")
    asyncio.run(scenario())
    assert "RuntimeError('boom')" in caplog.text
