"""Runs an LLMEngine on a thread of its own for asyncio services.

All engine state is touched only on the engine thread: callers submit closures that run
between steps, and each request's outputs flow back through an asyncio queue. A consumer
that stops listening (client cancel, deadline) aborts its request, freeing its blocks.

An optional `OutputObserver` (the metrics' request-latency tracker) sees, on the engine
thread, each streamed request start, every output dispatched, and each stream's end.
"""

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from shared.core.request import Request
from shared.engine.llm_engine import LLMEngine
from shared.engine.outputs import RequestOutput
from shared.sampling.params import SamplingParams

logger = logging.getLogger(__name__)

IDLE_WAKE_S = 1.0  # an idle engine thread runs its loop (and on_loop) at least this often


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


class OutputObserver(Protocol):
    """Called on the engine thread; must be quick and must not touch engine state."""

    def on_start(self, request_id: str, requests: list[Request]) -> None:
        """A streamed request was added (or, decode role, activated); `requests` are its
        engine requests (n of them), possibly empty if it already finished."""

    def on_outputs(self, outputs: list[RequestOutput]) -> None:
        """Outputs about to be streamed (after each step, or from an activation)."""

    def on_stop(self, request_id: str) -> None:
        """The request's stream closed, finished or not."""


class EngineDeadError(RuntimeError):
    """The engine thread failed; every request in flight gets this."""


class RequestFailedError(RuntimeError):
    """Computing this one request failed (finish reason "error"); the engine carries on."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine, observer: OutputObserver | None = None,
                 on_failure: Callable[[BaseException], None] | None = None):
        """`on_failure(error)` is called on the engine thread once, if the engine fails as a
        whole (the service then stops serving and exits)."""
        self.engine = engine
        self.observer = observer
        self.on_failure = on_failure
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        # Called on the engine thread every loop iteration with whether it has nothing to run
        # (memory trimming: shared.memory.idle_trim.HeapTrimmer.on_loop).
        self.on_loop: Callable[[bool], Any] | None = None
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._stopping = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._commands.put(None)
        self._thread.join(timeout=30)
        self._fail_queued_calls("the engine is stopped")
        self.engine.guided.shutdown()

    # ---- calls from asyncio --------------------------------------------------------------

    async def call(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """Run `fn(*args, **kwargs)` on the engine thread between steps; return its result."""
        if self.error is not None:
            raise EngineDeadError(str(self.error))
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._commands.put((fn, args, kwargs, loop, future))
        if self._stopping.is_set() or self.error is not None:
            self._fail_queued_calls(str(self.error or "the engine is stopped"))  # nobody else will
        return await future

    def _fail_queued_calls(self, reason: str) -> None:
        """Settle every call still queued with EngineDeadError, once the engine thread is gone
        (or going): otherwise its caller would wait forever."""
        if self._thread.is_alive() and self.error is None:
            return
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command is not None and command[3] is not None:
                _, _, _, loop, future = command
                with contextlib.suppress(RuntimeError):  # that caller's loop is closed: nobody waits
                    loop.call_soon_threadsafe(_settle, future, None, EngineDeadError(reason))

    async def prepare(self, params: SamplingParams) -> None:
        """Per-request work too heavy for the engine thread (compiling a guided constraint),
        done on worker threads before admission: the request waits here, outside the
        scheduler, while the engine keeps stepping. Raises InvalidRequestError."""
        await self.engine.guided.prepare(params.guided)

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
            await self.call(self._start_request, request_id, add)
            while not finished:
                output = await stream.queue.get()
                if isinstance(output, BaseException):
                    raise EngineDeadError(str(output))
                finished = output.finished
                if output.error is not None:
                    raise RequestFailedError(output.error)
                yield output
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self.submit(self.engine.abort_request, request_id)
            if self.observer is not None:
                self.submit(self.observer.on_stop, request_id)

    async def abort(self, request_id: str) -> None:
        """Abort a streamed request: its stream gets the final (aborted) output and ends."""
        await self.call(self._abort_and_dispatch, request_id)

    def _abort_and_dispatch(self, request_id: str) -> None:
        output = self.engine.abort_request(request_id)
        self._dispatch([output] if output is not None else [])

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
                is_idle = not self.engine.scheduler.num_unfinished
                if self.on_loop is not None:
                    self._notify(self.on_loop, is_idle)
                self._run_commands(block=is_idle)
                if self.engine.scheduler.num_unfinished:
                    self._dispatch(self.engine.step())
        except BaseException as error:  # noqa: BLE001 - fail every stream, then stop
            logger.exception("engine thread failed")
            self.error = error
            for stream in list(self._streams.values()):
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, error)
            self._fail_queued_calls(str(error))
            if self.on_failure is not None:
                self._notify(self.on_failure, error)

    def _run_commands(self, block: bool) -> None:
        try:  # an idle loop still wakes now and then, so that on_loop sees it idle
            command = self._commands.get(block=block, timeout=IDLE_WAKE_S if block else None)
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

    def _start_request(self, request_id: str, add: Callable[[], Any]) -> None:
        requests = self._requests_of(request_id)  # decode role: the reservation, before activation
        outputs = _outputs_of(add())
        if self.observer is not None:
            self._notify(self.observer.on_start, request_id, requests or self._requests_of(request_id))
        self._dispatch(outputs)

    def _requests_of(self, request_id: str) -> list[Request]:
        return self.engine.requests_of(request_id)

    def _notify(self, hook: Callable[..., None], *args) -> None:
        """Call an observer hook; its failure is logged, never the engine's."""
        try:
            hook(*args)
        except Exception:  # noqa: BLE001 - metrics must not stop the engine
            logger.exception("output observer %s failed", getattr(hook, "__name__", hook))

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        if self.observer is not None and outputs:
            self._notify(self.observer.on_outputs, outputs)
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
