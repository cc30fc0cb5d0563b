"""Runs an LLMEngine on a thread of its own for asyncio services.

All engine state is touched only on the engine thread: callers submit closures that run
between steps, and each request's outputs flow back through an asyncio queue. A consumer
that stops listening (client cancel, deadline) aborts its request, freeing its blocks.
"""

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from shared.engine.llm_engine import LLMEngine
from shared.engine.outputs import RequestOutput

logger = logging.getLogger(__name__)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


@dataclass
class EngineLoad:
    num_waiting: int
    num_running: int
    num_reserved: int
    num_free_blocks: int
    num_total_blocks: int


class EngineDeadError(RuntimeError):
    """The engine thread failed; every request in flight gets this."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._stopping = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._commands.put(None)
        self._thread.join(timeout=30)

    # ---- calls from asyncio --------------------------------------------------------------

    async def call(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Run `fn(*args, **kwargs)` on the engine thread between steps; return its result."""
        if self.error is not None:
            raise EngineDeadError(str(self.error))
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._commands.put((fn, args, kwargs, loop, future))
        return await future

    def submit(self, fn: Callable[..., Any], *args, **kwargs) -> None:
        """Fire and forget (safe from `finally` blocks of cancelled tasks)."""
        self._commands.put((fn, args, kwargs, None, None))

    async def generate(self, request_id: str, add: Callable[[], Any]) -> AsyncIterator[RequestOutput]:
        """Open the output stream of `request_id`, run `add` on the engine thread (it queues
        or activates the request; outputs it returns are streamed first), then yield outputs
        until the request finishes."""
        stream = self._open_stream(request_id)
        finished = False
        try:
            await self.call(lambda: self._dispatch(_outputs_of(add())))
            while not finished:
                output = await stream.queue.get()
                if isinstance(output, BaseException):
                    raise EngineDeadError(str(output))
                finished = output.finished
                yield output
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self.submit(self.engine.abort_request, request_id)

    def load(self) -> EngineLoad:
        """A racy but harmless snapshot for heartbeats and routing."""
        scheduler, pool = self.engine.scheduler, self.engine.block_pool
        return EngineLoad(len(scheduler.waiting), len(scheduler.running), len(scheduler.reserved),
                          pool.num_free_blocks, pool.num_blocks)

    def _open_stream(self, request_id: str) -> _Stream:
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[request_id] = stream
        return stream

    # ---- the engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._run_commands(block=not self.engine.scheduler.num_unfinished)
                if self.engine.scheduler.num_unfinished:
                    self._dispatch(self.engine.step())
        except BaseException as error:  # noqa: BLE001 - fail every stream, then stop
            logger.exception("engine thread failed")
            self.error = error
            for stream in list(self._streams.values()):
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, error)

    def _run_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(block=block)
        except queue.Empty:
            return
        while command is not None:
            self._run_command(*command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _run_command(self, fn, args, kwargs, loop, future) -> None:
        try:
            result = fn(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - handed to the caller
            if loop is None:
                logger.warning("engine command %s failed: %s", getattr(fn, "__name__", fn), error)
            else:
                loop.call_soon_threadsafe(_settle, future, None, error)
            return
        if loop is not None:
            loop.call_soon_threadsafe(_settle, future, result, None)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, output)


def _outputs_of(result: Any) -> list[RequestOutput]:
    """`add` may return outputs (activate_request) or something else (add_request's id)."""
    return result if isinstance(result, list) else []


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
