"""AsyncEngine: the in-thread EngineClient (shared.engine_api.client). The LLMEngine steps on a
thread of its own; asyncio services talk to it only through the typed API.

All engine state is touched only on the engine thread: each API call becomes a command that
runs there between steps, and each request's outputs flow back through an asyncio queue. A
consumer that stops listening (client cancel, deadline) aborts its request, freeing its
blocks. The KV connector wakes the thread when a transfer ends; its outcomes reach prefill
streams from there, and the scheduler's reservation events reach `wait_kv` callers and
`on_reservation_event` (shared.engine.kv_waits).

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
from typing import Any

import torch

from shared.core.remote_kv import RemoteKVState
from shared.engine.introspection import engine_info, engine_load, engine_status, kv_cache_events
from shared.engine.kv_waits import KVWaits
from shared.engine.llm_engine import LLMEngine
from shared.engine_api.client import (
    CachedSend, EngineDeadError, EngineInfo, EngineLoad, EngineStatus, GenerateRequest, KVCacheEvents, KVReservation,
    KVTransferFailedError, OutputObserver, RequestFailedError, ReservationEvent, raise_if_failed,
)
from shared.engine_api.outputs import RequestOutput, SampledLogprobs
from shared.errors import InvalidRequestError

logger = logging.getLogger(__name__)

__all__ = ["AsyncEngine", "EngineDeadError", "KVTransferFailedError", "OutputObserver", "RequestFailedError"]
IDLE_WAKE_S = 1.0  # an idle engine thread runs its loop (and on_loop) at least this often


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


_WAKE = (lambda: None, (), {}, None, None)  # a command that only wakes an idle engine thread


class AsyncEngine:
    def __init__(self, engine: LLMEngine, observer: OutputObserver | None = None,
                 on_failure: Callable[[BaseException], None] | None = None,
                 on_loop: Callable[[bool], Any] | None = None, num_threads: int | None = None):
        """`on_failure(error)` is called on the engine thread once, if the engine fails as a
        whole (the service then stops serving and exits); `on_loop(is_idle)` on every loop
        iteration, with whether it has nothing to run (memory trimming); `num_threads`: torch
        threads of the steps."""
        self._engine = engine
        self.info: EngineInfo = engine_info(engine.core)
        self.observer = observer
        self.on_failure = on_failure
        self.on_loop = on_loop
        self._num_threads = num_threads
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._kv_waits = KVWaits()
        self._loop: asyncio.AbstractEventLoop | None = None  # the service's: reservation events go there
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._stopping = threading.Event()
        self.error: BaseException | None = None
        if engine.core.connector is not None:
            engine.core.connector.set_wakeup(lambda: self._commands.put(_WAKE))

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    @property
    def on_reservation_event(self) -> Callable[[ReservationEvent], None] | None:
        return self._kv_waits.listener

    @on_reservation_event.setter
    def on_reservation_event(self, listener: Callable[[ReservationEvent], None] | None) -> None:
        self._kv_waits.listener = listener

    async def stop(self) -> None:
        await asyncio.to_thread(self._stop_thread)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None and not self._stopping.is_set()

    def _stop_thread(self) -> None:
        self._stopping.set()
        self._commands.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._fail_queued_calls("the engine is stopped")
        self._engine.core.guided.shutdown()
        if self._engine.core.connector is not None:
            self._engine.core.connector.shutdown()

    # ---- requests -------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        await self._engine.core.guided.prepare(request.params.guided)  # worker threads, off the step loop
        engine = self._engine

        def add() -> list[RequestOutput]:
            engine.add_request(list(request.prompt_token_ids), request.params, request.request_id,
                               request.cache_salt, request.num_resumed_output_tokens, request.kv_send,
                               request.lora_request)
            return []

        async with contextlib.aclosing(self._stream(request.request_id, add)) as outputs:
            async for output in outputs:
                yield output

    async def abort(self, request_id: str) -> None:
        """Abort a streamed request: its stream gets the final (aborted) output and ends."""
        await self._call(self._abort_and_dispatch, request_id)

    async def reserve_kv(self, request: GenerateRequest, lease_s: float | None = None) -> KVReservation:
        request_id = request.request_id
        await self._engine.core.guided.prepare(request.params.guided)
        engine, made = self._engine, []

        def reserve():
            made.append(engine.reserve_request(list(request.prompt_token_ids), request.params, request_id,
                                               request.cache_salt, request.num_resumed_output_tokens,
                                               request.lora_request, lease_s))
            return made[0]

        def abort_if_made() -> None:  # queued after reserve(), so `made` is final when it runs
            if made:
                engine.abort_request(request_id)

        try:
            return await self._call(reserve)
        except BaseException:
            self._submit(abort_if_made)
            raise

    async def renew_kv(self, request_id: str, lease_s: float) -> bool:
        return await self._call(self._engine.renew_reserved, request_id, lease_s)

    async def wait_kv(self, request_id: str) -> None:
        await self._kv_waits.wait(request_id, lambda: self._call(self._has_arrived, request_id))

    def _has_arrived(self, request_id: str) -> bool:
        state = self._engine.reservation_state(request_id)
        if state is None:
            raise InvalidRequestError("request_id", f"{request_id!r} has no reservation")
        return state == RemoteKVState.ARRIVED

    async def generate_reserved(self, request_id: str, first_token_id: int,
                                first_logprobs: SampledLogprobs | None = None) -> AsyncIterator[RequestOutput]:
        engine = self._engine
        stream = self._stream(request_id, lambda: engine.start_reserved(request_id, first_token_id, first_logprobs))
        async with contextlib.aclosing(stream) as outputs:
            async for output in outputs:
                yield output

    async def prefill_reserved(self, request_id: str) -> AsyncIterator[RequestOutput]:
        engine = self._engine
        stream = self._stream(request_id, lambda: engine.prefill_reserved(request_id))
        async with contextlib.aclosing(stream) as outputs:
            async for output in outputs:
                yield output

    async def release_kv(self, request_id: str, keep_arrived: bool = False) -> bool:
        return await self._call(self._engine.release_reserved, request_id, keep_arrived)

    async def send_cached(self, send: CachedSend) -> int:
        return await self._call(self._engine.send_cached, send)

    # ---- load, status, events -------------------------------------------------------------

    def load(self) -> EngineLoad:
        """A racy but harmless snapshot for heartbeats and routing."""
        return engine_load(self._engine.core)

    def latest_status(self) -> EngineStatus:
        return engine_status(self._engine.core)

    async def status(self) -> EngineStatus:
        return await self._call(engine_status, self._engine.core)

    async def kv_events(self, snapshot: bool = False) -> KVCacheEvents:
        core = self._engine.core
        return await self._call(kv_cache_events, core.block_pool, snapshot, core.tiers.manager)

    # ---- streams --------------------------------------------------------------------------

    async def _stream(self, request_id: str, start: Callable[[], list[RequestOutput]]) -> AsyncIterator[RequestOutput]:
        """Open `request_id`'s output stream, run `start` on the engine thread (it queues or
        starts the request; outputs it returns are streamed first), then yield outputs until
        the request finishes."""
        if request_id in self._streams:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[request_id] = stream
        is_started = is_finished = False
        try:
            await self._call(self._start_request, request_id, start)
            is_started = True
            while not is_finished:
                output = await stream.queue.get()
                if isinstance(output, BaseException):
                    raise EngineDeadError(str(output))
                is_finished = output.finished
                raise_if_failed(request_id, output)
                yield output
        finally:
            self._streams.pop(request_id, None)
            if is_started and not is_finished:
                self._submit(self._engine.abort_request, request_id)
            if self.observer is not None:
                self._submit(self.observer.on_stop, request_id)

    def _start_request(self, request_id: str, start: Callable[[], list[RequestOutput]]) -> None:
        outputs = start()
        if self.observer is not None:
            self._notify(self.observer.on_start, request_id)
        self._dispatch(outputs)

    def _abort_and_dispatch(self, request_id: str) -> None:
        output = self._engine.abort_request(request_id)
        self._dispatch([output] if output is not None else [])

    # ---- commands -------------------------------------------------------------------------

    async def _call(self, fn: Callable[..., Any], *args) -> Any:
        """Run `fn(*args)` on the engine thread between steps; return its result."""
        if self.error is not None:
            raise EngineDeadError(str(self.error))
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._commands.put((fn, args, {}, loop, future))
        if self._stopping.is_set() or self.error is not None:
            self._fail_queued_calls(str(self.error or "the engine is stopped"))  # nobody else will
        return await future

    def _submit(self, fn: Callable[..., Any], *args) -> None:
        """Fire and forget (safe from `finally` blocks of cancelled tasks)."""
        self._commands.put((fn, args, {}, None, None))

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

    # ---- the engine thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self._num_threads:
                torch.set_num_threads(self._num_threads)  # per calling thread: set it where steps run
            while not self._stopping.is_set():
                is_idle = not self._engine.core.scheduler.num_unfinished
                if self.on_loop is not None:
                    self._notify(self.on_loop, is_idle)
                self._run_commands(block=is_idle)
                # transfers that ended during the last step go out before the next one computes
                self._dispatch(self._engine.poll_kv_transfers())
                self._dispatch_reservation_events(self._engine.drain_reservation_events())
                self._dispatch(self._engine.step(wait_for_sends=False))  # first tokens out at once
                self._dispatch(self._engine.finish_step_sends())
                self._dispatch_reservation_events(self._engine.drain_reservation_events())
        except BaseException as error:  # noqa: BLE001 - fail every stream, then stop
            logger.exception("engine thread failed")
            self.error = error
            for stream in list(self._streams.values()):
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, error)
            if self._loop is not None:
                with contextlib.suppress(RuntimeError):  # the service's loop is closed: nobody waits
                    self._loop.call_soon_threadsafe(self._kv_waits.fail_all,
                                                    EngineDeadError(f"the engine failed: {error}"))
            self._fail_queued_calls(str(error))
            if self.on_failure is not None:
                self._notify(self.on_failure, error)

    def _run_commands(self, block: bool) -> None:
        # an idle loop still wakes now and then, so that on_loop sees it idle, and by the next
        # reservation's deadline (it times out then)
        timeout_s = min(IDLE_WAKE_S, self._engine.seconds_to_next_deadline()) if block else None
        try:
            command = self._commands.get(block=block, timeout=timeout_s)
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

    def _dispatch_reservation_events(self, events: list[ReservationEvent]) -> None:
        for event in events:
            with contextlib.suppress(RuntimeError):  # the service's loop is closed: nobody waits
                self._loop.call_soon_threadsafe(self._kv_waits.deliver, event)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
