"""The engine-core process's loop: take the service's messages between steps, step, send.

While requests run it never blocks: it drains whatever messages arrived, steps, and sends the
step's token outputs with the load; the service detokenizes them while the next step runs.
Idle, it waits for messages (waking every `IDLE_POLL_MS` to trim memory). Grammar compilation
happens on worker threads (GuidedDecoding.prepare): a guided request waits outside the
scheduler until its grammar is ready, while the others keep stepping. A failure of the engine
as a whole (a forward pass) propagates: the caller reports it and the process exits.
"""

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import zmq

from shared.core.request import RequestStatus
from shared.engine.core_process.messages import (AbortRequests, AddRequest, FinishRequests, Query, QueryResult,
                                                 Rejected, ServiceMessage, Shutdown, StepOutputs,
                                                 decode_service_message, encode)
from shared.engine.core_queries import engine_load, engine_memory, engine_status, kv_cache_events
from shared.engine.engine_core import EngineCore
from shared.errors import InvalidRequestError

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 1000
# How often the step outputs carry the engine's status (for metrics scrapes without a round trip).
STATUS_INTERVAL_S = 0.5
# While grammars compile and nothing steps: how often to look whether one is ready.
COMPILE_POLL_MS = 5


class GrammarPreparer:
    """Runs GuidedDecoding.prepare on an event loop of its own thread (started on first use)."""

    def __init__(self, core: EngineCore):
        self.core = core
        self._loop: asyncio.AbstractEventLoop | None = None

    def submit(self, message: AddRequest) -> Future:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="grammar-prepare", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(self.core.guided.prepare(message.params.guided), self._loop)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)


class CoreLoop:
    def __init__(self, core: EngineCore, inbox: zmq.Socket, outbox: zmq.Socket,
                 on_idle: Callable[[], object] | None = None):
        self.core = core
        self.inbox = inbox
        self.outbox = outbox
        self.on_idle = on_idle
        self.preparer = GrammarPreparer(core)
        self._compiling: dict[str, tuple[Future, AddRequest]] = {}
        self._is_stopping = False
        self._last_status_time = float("-inf")

    def run(self) -> None:
        """Until a Shutdown message; exceptions of the engine as a whole propagate."""
        self._send(self._step_outputs([]))
        try:
            while not self._is_stopping:
                self._run_once()
        finally:
            self.preparer.stop()

    def _run_once(self) -> None:
        is_stepping = self.core.scheduler.num_unfinished > 0
        if not is_stepping and not self._compiling and self.on_idle is not None:
            self.on_idle()
        timeout = 0 if is_stepping else COMPILE_POLL_MS if self._compiling else IDLE_POLL_MS
        changed = self._handle_messages(timeout)
        changed = self._admit_compiled() or changed
        if self.core.scheduler.num_unfinished > 0:
            self._send(self._step_outputs(self.core.step()))
        elif changed:
            self._send(self._step_outputs([]))

    def _step_outputs(self, outputs: list) -> StepOutputs:
        """The outputs with the load, and the status when due or when the core went idle."""
        now = time.monotonic()
        is_idle = self.core.scheduler.num_unfinished == 0
        if is_idle or now - self._last_status_time >= STATUS_INTERVAL_S:
            self._last_status_time = now
            return StepOutputs(outputs, engine_load(self.core), engine_status(self.core))
        return StepOutputs(outputs, engine_load(self.core))

    def _handle_messages(self, timeout_ms: int) -> bool:
        """Handle every message waiting (after up to `timeout_ms` for the first); True if any."""
        if not self.inbox.poll(timeout_ms):
            return False
        while True:
            try:
                data = self.inbox.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return True
            self._handle(decode_service_message(data.buffer))

    def _handle(self, message: ServiceMessage) -> None:
        if isinstance(message, AddRequest):
            if message.params.guided is not None:
                self._compiling[message.request_id] = (self.preparer.submit(message), message)
            else:
                self._add(message)
        elif isinstance(message, AbortRequests):
            for request_id in message.request_ids:
                self._compiling.pop(request_id, None)
                self.core.abort_request(request_id)
        elif isinstance(message, FinishRequests):
            status = RequestStatus.FINISHED_STOPPED if message.reason == "stop" else RequestStatus.FINISHED_ERROR
            self.core.finish_requests(message.child_ids, status, message.error)
        elif isinstance(message, Query):
            self._send(self._answer(message))
        elif isinstance(message, Shutdown):
            self._is_stopping = True

    def _add(self, message: AddRequest) -> None:
        try:
            self.core.add_request(message.request_id, message.prompt_token_ids, message.params, message.cache_salt,
                                  message.hold_blocks_on_finish, message.num_resumed_output_tokens)
        except InvalidRequestError as error:
            self._send(Rejected(message.request_id, error.field, error.message))

    def _admit_compiled(self) -> bool:
        """Admit the guided requests whose grammar is ready (or reject them); True if any."""
        ready = [request_id for request_id, (future, _) in self._compiling.items() if future.done()]
        for request_id in ready:
            future, message = self._compiling.pop(request_id)
            error = future.exception()
            if error is None:
                self._add(message)
            elif isinstance(error, InvalidRequestError):
                self._send(Rejected(request_id, error.field, error.message))
            else:
                self._send(Rejected(request_id, "guided", f"compiling the constraint failed: {error}"))
        return bool(ready)

    def _answer(self, query: Query) -> QueryResult:
        if query.what == "status":
            return QueryResult(query.call_id, status=engine_status(self.core))
        if query.what == "memory":
            return QueryResult(query.call_id, memory=engine_memory(self.core))
        return QueryResult(query.call_id, kv_events=kv_cache_events(self.core, snapshot=query.what == "kv_snapshot"))

    def _send(self, message) -> None:
        self.outbox.send(encode(message), copy=False)
