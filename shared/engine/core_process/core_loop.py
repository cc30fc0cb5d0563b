"""The engine core's loop: take the service's messages between steps, step, send. It runs
in the engine-core process, or on a thread of the service process (shared.engine.thread_transport);
either way it speaks the typed messages of shared.engine.core_process.messages over ZeroMQ.

While requests run it never blocks: it drains whatever messages arrived, steps, and sends the
step's token outputs with the load; the service detokenizes them while the next step runs.
Idle, it waits for a message or for the KV connector's wake-up (a transfer ended), waking
every `IDLE_POLL_MS` to trim memory, and by the next reservation's deadline (it times out
then). Grammar compilation happens on worker threads (GuidedDecoding.prepare): a guided
request waits outside the scheduler until its grammar is ready, while the others keep
stepping (a reservation's grammar likewise, before it is made). A failure of the engine as a
whole (a forward pass) propagates: the caller reports it and the core ends. A failing
`on_loop` hook is logged, never the loop's failure.
"""

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import msgspec
import zmq

from shared.core.remote_kv import RemoteKVState
from shared.core.request import RequestStatus
from shared.engine.core_process.messages import (AbortRequests, AddRequest, CallResult, FinishRequests,
                                                 PrefillReserved, Query, Rejected, ReleaseKV, RenewKV, ReserveKV,
                                                 SendCached, ServiceMessage, Shutdown, StartReserved, StepOutputs,
                                                 decode_service_message, encode)
from shared.engine.core_process.request_spans import RequestSpans
from shared.engine.engine_core import EngineCore
from shared.engine.introspection import engine_load, engine_memory, engine_status, kv_cache_events
from shared.engine_api.client import KVReservation, ReservationEvent
from shared.engine_api.errors import CapacityError
from shared.errors import InvalidRequestError
from shared.tracing import is_enabled as tracing_is_enabled

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 1000
# While grammars compile and nothing steps: how often to look whether one is ready.
COMPILE_POLL_MS = 5
# How often the step outputs carry the engine's status (for metrics scrapes without a round trip).
STATUS_INTERVAL_S = 0.5


class GrammarPreparer:
    """Runs GuidedDecoding.prepare on an event loop of its own thread (started on first use)."""

    def __init__(self, core: EngineCore):
        self.core = core
        self._loop: asyncio.AbstractEventLoop | None = None

    def submit(self, message: AddRequest | ReserveKV) -> Future:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="grammar-prepare", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(self.core.guided.prepare(message.params.guided), self._loop)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)


class WakeupPipe:
    """Lets another thread (the KV connector's) wake the loop while it waits on its socket."""

    def __init__(self):
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._lock = threading.Lock()
        self._is_closed = False

    def wake(self) -> None:
        with self._lock:  # never a write to a closed (and maybe reused) descriptor
            if self._is_closed:
                return
            with contextlib.suppress(BlockingIOError):  # already full: the loop wakes anyway
                os.write(self._write_fd, b"w")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.read_fd, 4096):
                pass

    def close(self) -> None:
        with self._lock:
            self._is_closed = True
            os.close(self.read_fd)
            os.close(self._write_fd)


class CoreLoop:
    def __init__(self, core: EngineCore, inbox: zmq.Socket, outbox: zmq.Socket,
                 on_loop: Callable[[bool], object] | None = None):
        self.core = core
        self.inbox = inbox
        self.outbox = outbox
        self.on_loop = on_loop
        self.preparer = GrammarPreparer(core)
        self.wakeup = WakeupPipe()
        self.poller = zmq.Poller()
        self.poller.register(inbox, zmq.POLLIN)
        self.poller.register(self.wakeup.read_fd, zmq.POLLIN)
        if core.connector is not None:
            core.connector.set_wakeup(self.wakeup.wake)
        self._compiling: dict[str, tuple[Future, AddRequest | ReserveKV]] = {}
        # Each request's spans while tracing is on (None: off, nothing is tracked).
        self.spans = RequestSpans() if tracing_is_enabled() else None
        if self.spans is not None:
            core.step_listener = self.spans.on_step_applied
        self._is_stopping = False
        self._last_status_time = float("-inf")

    def run(self) -> None:
        """Until a Shutdown message; exceptions of the engine as a whole propagate."""
        self._send_outputs([], always=True)
        try:
            while not self._is_stopping:
                self._run_once()
        finally:
            if self.core.connector is not None:
                self.core.connector.set_wakeup(lambda: None)
            self.preparer.stop()
            self.wakeup.close()

    def _run_once(self) -> None:
        is_stepping = self.core.scheduler.num_unfinished > 0
        if self.on_loop is not None:
            try:
                self.on_loop(not is_stepping and not self._compiling)
            except Exception:  # noqa: BLE001 - memory trimming must not stop the engine
                logger.exception("the engine loop's hook failed")
        timeout = 0 if is_stepping else COMPILE_POLL_MS if self._compiling else IDLE_POLL_MS
        next_deadline_s = self.core.seconds_to_next_deadline()
        if next_deadline_s < timeout / 1000:
            timeout = math.ceil(next_deadline_s * 1000)
        changed = self._wait_and_handle_messages(timeout)
        changed = self._admit_compiled() or changed
        self._send_transfers_ended()
        if self.spans is not None:
            self.spans.on_step_start()
        outputs = self.core.step()  # applies finished KV transfers first; no-op when idle
        self._send_outputs(outputs, always=changed or is_stepping)
        self._send_outputs(self.core.finish_step_sends())  # after the first tokens above went out

    def _send_transfers_ended(self) -> None:
        """KV that arrived or was sent while the last step ran, reported before the next step
        computes: a decode service starts a request once its KV has arrived, and a prefill
        service answers once the KV is sent; neither should wait for another step."""
        self._send_outputs(self.core.poll_kv_transfers())

    def _send_outputs(self, outputs: list, always: bool = False) -> None:
        """Send `outputs` with every reservation event since the last send, so an event never
        reaches the service after an output or call result that followed it (a send that ended
        may have delivered KV here); nothing when there is neither, unless `always`."""
        events = self.core.drain_reservation_events()
        if outputs or events or always:
            self._send(self._step_outputs(outputs, events))

    def _step_outputs(self, outputs: list, events: list[ReservationEvent] | None = None) -> StepOutputs:
        """The outputs with the load, and the status when due or when the core went idle."""
        if self.spans is not None:
            self.spans.on_outputs(outputs)
            self.spans.on_reservation_events(events or ())
        now = time.monotonic()
        is_idle = self.core.scheduler.num_unfinished == 0
        status = None
        if is_idle or now - self._last_status_time >= STATUS_INTERVAL_S:
            self._last_status_time = now
            status = engine_status(self.core)
        return StepOutputs(outputs, engine_load(self.core), status, events or [])

    def _wait_and_handle_messages(self, timeout_ms: int) -> bool:
        """Handle every message waiting (after up to `timeout_ms` for the first message or a
        wake-up); True if there were any."""
        events = dict(self.poller.poll(timeout_ms))
        if self.wakeup.read_fd in events:
            self.wakeup.drain()
        if self.inbox not in events:
            return False
        while True:
            try:
                data = self.inbox.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return True
            self._handle(decode_service_message(data.buffer))

    def _handle(self, message: ServiceMessage) -> None:
        if isinstance(message, AddRequest):
            if self.spans is not None:
                self.spans.on_arrival(message.request_id, message.trace_context, "generate", message.kv_send)
            logger.debug("request %s arrived: %d prompt tokens", message.request_id, len(message.prompt_token_ids),
                         extra={"request_id": message.request_id})
            if message.params.guided is not None:
                self._compiling[message.request_id] = (self.preparer.submit(message), message)
            else:
                self._add(message)
        elif isinstance(message, ReserveKV) and message.params.guided is not None:
            self._compiling[message.request_id] = (self.preparer.submit(message), message)
        elif isinstance(message, (ReserveKV, RenewKV, ReleaseKV, SendCached, Query)):
            self._send(self._answer(message))
        elif isinstance(message, StartReserved):
            self._start_reserved(message)
        elif isinstance(message, PrefillReserved):
            self._prefill_reserved(message)
        elif isinstance(message, AbortRequests):
            for request_id in message.request_ids:
                self._compiling.pop(request_id, None)
                self.core.abort_request(request_id)
                if self.spans is not None:
                    self.spans.on_released(request_id, "abort")
        elif isinstance(message, FinishRequests):
            status = RequestStatus.FINISHED_STOPPED if message.reason == "stop" else RequestStatus.FINISHED_ERROR
            self.core.finish_requests(message.child_ids, status, message.error)
        elif isinstance(message, Shutdown):
            self._is_stopping = True

    def _add(self, message: AddRequest) -> None:
        try:
            self.core.add_request(message.request_id, message.prompt_token_ids, message.params, message.cache_salt,
                                  message.num_resumed_output_tokens, message.kv_send, message.lora_request)
        except InvalidRequestError as error:
            self._reject(message.request_id, error.field, error.message)

    def _reject(self, request_id: str, field: str, message: str) -> None:
        if self.spans is not None:
            self.spans.on_released(request_id, "rejected")
        self._send(Rejected(request_id, field, message))

    def _start_reserved(self, message: StartReserved) -> None:
        try:
            outputs = self.core.start_reserved(message.request_id, message.first_token_id, message.first_logprobs)
        except InvalidRequestError as error:
            self._send(Rejected(message.request_id, error.field, error.message))
            return
        self._send_outputs(outputs, always=True)

    def _prefill_reserved(self, message: PrefillReserved) -> None:
        try:
            self.core.prefill_reserved(message.request_id)
        except InvalidRequestError as error:
            self._send(Rejected(message.request_id, error.field, error.message))

    def _admit_compiled(self) -> bool:
        """Admit the guided requests and reservations whose grammar is ready (or refuse
        them); True if any."""
        ready = [request_id for request_id, (future, _) in self._compiling.items() if future.done()]
        for request_id in ready:
            future, message = self._compiling.pop(request_id)
            error = future.exception()
            if self.spans is not None:
                self.spans.on_compiled(request_id, None if error is None else str(error))
            if error is not None and not isinstance(error, InvalidRequestError):
                error = InvalidRequestError("guided", f"compiling the constraint failed: {error}")
            if isinstance(message, ReserveKV):
                self._send(self._answer(message) if error is None else self._with_load(CallResult(
                    message.call_id, error_kind="invalid", error_field=error.field, error=error.message)))
            elif error is None:
                self._add(message)
            else:
                self._reject(request_id, error.field, error.message)
        return bool(ready)

    def _answer(self, call: ReserveKV | RenewKV | ReleaseKV | SendCached | Query) -> CallResult:
        return self._with_load(self._result_of(call))

    def _with_load(self, result: CallResult) -> CallResult:
        """The result with the load after the call, so `load()` agrees with the call once
        it returns (a released reservation's blocks are free by then)."""
        return msgspec.structs.replace(result, load=engine_load(self.core))

    def _result_of(self, call: ReserveKV | RenewKV | ReleaseKV | SendCached | Query) -> CallResult:
        try:
            if isinstance(call, ReserveKV):
                return CallResult(call.call_id, reservation=self._reserve(call))
            if isinstance(call, RenewKV):
                return CallResult(call.call_id, renewed=self.core.renew_reserved(call.request_id, call.lease_s))
            if isinstance(call, ReleaseKV):
                if self.spans is not None:
                    self.spans.on_released(call.request_id, "released")
                return CallResult(call.call_id, released=self.core.release_reserved(call.request_id,
                                                                                   call.keep_arrived))
            if isinstance(call, SendCached):
                return CallResult(call.call_id, num_blocks=self.core.send_cached(call.send))
            return self._query(call)
        except InvalidRequestError as error:
            return CallResult(call.call_id, error_kind="invalid", error_field=error.field, error=error.message)
        except CapacityError as error:
            return CallResult(call.call_id, error_kind="capacity", error=str(error))

    def _reserve(self, call: ReserveKV) -> KVReservation:
        if self.spans is not None:
            self.spans.on_arrival(call.request_id, call.trace_context, "reservation")
        logger.debug("reservation %s arrived: %d prompt tokens", call.request_id, len(call.prompt_token_ids),
                     extra={"request_id": call.request_id})
        try:
            return self.core.reserve_request(call.prompt_token_ids, call.params, call.request_id, call.cache_salt,
                                             call.num_resumed_output_tokens, call.lora_request, call.lease_s)
        except BaseException:
            if self.spans is not None:
                self.spans.on_released(call.request_id, "refused")
            raise

    def _query(self, query: Query) -> CallResult:
        if query.what == "status":
            return CallResult(query.call_id, status=engine_status(self.core))
        if query.what == "memory":
            return CallResult(query.call_id, memory=engine_memory(self.core))
        if query.what == "kv_arrived":
            state = self.core.reservation_state(query.request_id)
            if state is None:
                raise InvalidRequestError("request_id", f"{query.request_id!r} has no reservation")
            return CallResult(query.call_id, kv_arrived=state == RemoteKVState.ARRIVED)
        snapshot = query.what == "kv_snapshot"
        return CallResult(query.call_id, kv_events=kv_cache_events(self.core.block_pool, snapshot,
                                                                   self.core.tiers.manager))

    def _send(self, message) -> None:
        self.outbox.send(encode(message), copy=False)
