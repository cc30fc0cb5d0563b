"""Merge the streams of a request's n completions into one, as they arrive.

Each stream runs in its own task. The first failure cancels the others and is raised; when
the consumer stops (client cancel, error), every stream is closed, so each one cancels its
downstream calls and gives back what it reserved.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

_DONE = object()


async def merge_streams(streams: list[AsyncIterator[Any]]) -> AsyncIterator[Any]:
    queue: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(_pump(stream, queue)) for stream in streams]
    try:
        num_open = len(tasks)
        while num_open:
            item = await queue.get()
            if item is _DONE:
                num_open -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _pump(stream: AsyncIterator[Any], queue: asyncio.Queue) -> None:
    try:
        async with contextlib.aclosing(stream):
            async for item in stream:
                queue.put_nowait(item)
        queue.put_nowait(_DONE)
    except Exception as error:  # noqa: BLE001 - handed to the consumer, which raises it
        queue.put_nowait(error)
