"""EngineFrontend: the one engine client (shared.engine_api.client.EngineClient), whatever carries
its engine core (a `CoreTransport`, shared.engine.core_transport: a thread of this process or
a child process).

The frontend holds everything a request has outside the core, on the event loop that started
it: the output streams, the `OutputProcessor` (detokenization, stop strings, n > 1 groups),
aborts, the observer hooks, the prompts of its reservations and who waits for their KV
(`KVWaits`, shared.engine.kv_waits: the core's scheduler owns each reservation's state and
reports what happens to it as `ReservationEvent`s, delivered here in order with the outputs
and call results). The core
gets token ids and sends token outputs back after every step; the frontend turns them into
`RequestOutput`s while the core computes its next step. A stop string (or a failed text
pipeline) ends the completion here and tells the core to finish that request.

The same for either transport:
- Errors. InvalidRequestError for bad input (checked here, or refused by the core: the field
  named either way); CapacityError when a reservation has no room; RequestFailedError /
  KVTransferFailedError from a stream whose request (or its KV send) failed. When the core
  fails as a whole (an exception on its thread, its process killed or crashed) the frontend
  makes one EngineDeadError naming how it ended ("the engine thread failed: RuntimeError:
  ...", "the engine core process 7 was killed by SIGKILL: <its last words>"): `on_failure`
  gets it first (the service turns NOT_SERVING), then every stream, call and KV wait fails
  with an EngineDeadError of that message, and so does every later call. After `stop()`
  they fail with EngineDeadError("the engine is stopped").
- Hooks. Every hook runs on the event loop, and a hook that raises is logged, never the
  request's failure. For each stream the engine took, in this order:
  `observer.on_start(request_id)` once, just before its first outputs (or, for a stream that
  closes before any output, just before its on_stop); `observer.on_outputs(outputs)` for each
  batch of outputs, before the streams get them (an `abort()`'s final output included); and
  `observer.on_stop(request_id)` once, when the stream closes, whether it finished, was
  aborted or the engine died. A request the engine refused (InvalidRequestError) is never
  seen by the observer: it did not start, so it is not counted as aborted either.
- Text. Detokenization and stop strings run here, on the event loop, never on the core's
  thread; without a tokenizer outputs carry token ids only and stop strings are refused.

The frontend binds to the event loop that calls `start()`; use it from that loop only.
"""

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable

import zmq

from shared.engine.core_process.messages import (AbortRequests, AddRequest, CallResult, CoreFailed, CoreMessage,
                                                 FinishRequests, PrefillReserved, Query, Ready, Rejected, ReleaseKV,
                                                 RenewKV, ReserveKV, SendCached, Shutdown, StartReserved, StepOutputs,
                                                 decode_core_message, encode)
from shared.engine.core_transport import CoreConnection, CoreTransport
from shared.engine.kv_waits import KVWaits
from shared.engine.output_processor import OutputProcessor
from shared.engine_api.client import (CachedSend, CapacityError, EngineDeadError, EngineInfo, EngineLoad,
                                      EngineMemory, EngineStatus, GenerateRequest, KVCacheEvents, KVReservation,
                                      OutputObserver, ReservationEvent, ReservationEventKind, raise_if_failed)
from shared.engine_api.outputs import RequestOutput, SampledLogprobs
from shared.errors import InvalidRequestError
from shared.tracing import inject_context

logger = logging.getLogger(__name__)


class EngineFrontend:
    def __init__(self, transport: CoreTransport, tokenizer=None, observer: OutputObserver | None = None,
                 on_failure: Callable[[BaseException], None] | None = None):
        """`tokenizer`: the model's, for detokenization and stop strings (None: token ids only);
        `on_failure(error)`: told once, on the event loop, when the engine fails as a whole."""
        self.transport = transport
        self.tokenizer = tokenizer
        self.observer = observer
        self.on_failure = on_failure
        self.info: EngineInfo | None = transport.info
        self.error: EngineDeadError | None = None
        # Reservations in the core, with the prompts they were made for (their output
        # processing starts when they are decoded); the core's scheduler owns their state.
        self._reserved_prompts: dict[str, GenerateRequest] = {}
        self._kv_waits = KVWaits()
        self._connection: CoreConnection | None = None
        self._tasks: list[asyncio.Task] = []
        self._streams: dict[str, asyncio.Queue] = {}
        self._unannounced: set[str] = set()  # streams whose on_start has not been called yet
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._output_processor = OutputProcessor(tokenizer)
        self._load = EngineLoad(0, 0, 0, 0, 0)
        self._status: EngineStatus | None = None
        self._has_reported = asyncio.Event()
        self._last_words: str | None = None
        self._is_stopping = False

    # ---- life ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the core and wait until it reported its first status (EngineDeadError if it
        dies while starting)."""
        self._is_stopping, self.error, self._last_words, self._status = False, None, None, None
        self._has_reported = asyncio.Event()
        connection = await self.transport.start()
        self._connection, self.info = connection, connection.info
        self._load = EngineLoad(0, 0, 0, self.info.num_blocks, self.info.num_blocks)
        self._output_processor = OutputProcessor(self.tokenizer)
        self._tasks = [asyncio.create_task(self._read_outputs(connection), name="engine-core-outputs"),
                       asyncio.create_task(self._watch(connection), name="engine-core-watch")]
        await self._has_reported.wait()

    async def stop(self) -> None:
        """Shut the core down; streams, calls and KV waits still open fail."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        self._is_stopping = True
        if self.error is None:  # a core that ended reads nothing (and a send to it would wait)
            with contextlib.suppress(zmq.ZMQError):
                await connection.requests.send(encode(Shutdown()), flags=zmq.NOBLOCK)
        await self.transport.stop()
        self._fail_everything(self.error or EngineDeadError("the engine is stopped"))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.transport.close()

    @property
    def is_alive(self) -> bool:
        return self._connection is not None and self.error is None and not self._is_stopping

    async def _watch(self, connection: CoreConnection) -> None:
        how = await self.transport.wait_exit()
        if self._is_stopping or self._connection is not connection:
            return
        self._die(EngineDeadError(f"{how}: {self._last_words}" if self._last_words else how))

    def _die(self, error: EngineDeadError) -> None:
        """Callbacks first (the service turns NOT_SERVING), then everything in flight fails."""
        logger.error("%s", error)
        self.error = error
        self._notify(self.on_failure, error)
        self._fail_everything(error)
        self._has_reported.set()

    def _fail_everything(self, error: EngineDeadError) -> None:
        for stream in self._streams.values():
            stream.put_nowait(EngineDeadError(str(error)))
        calls, self._calls = self._calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(EngineDeadError(str(error)))
        self._kv_waits.fail_all(EngineDeadError(str(error)))
        self._reserved_prompts.clear()
        self._output_processor = OutputProcessor(self.tokenizer)
        self._load = EngineLoad(0, 0, 0, self._load.num_free_blocks, self._load.num_total_blocks)

    def _check_alive(self) -> None:
        if self.error is not None:
            raise EngineDeadError(str(self.error))
        if not self.is_alive:
            raise EngineDeadError("the engine is stopped")

    # ---- requests ------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """Queue the request in the core and stream its outputs until it finishes; closing the
        stream early aborts it."""
        self._check_alive()
        self._check_request(request)
        message = AddRequest(request.request_id, list(request.prompt_token_ids), request.params, request.cache_salt,
                             request.num_resumed_output_tokens, request.kv_send, inject_context(),
                             request.lora_request)
        async with contextlib.aclosing(self._stream(request, message)) as outputs:  # closing this aborts it
            async for output in outputs:
                yield output

    async def abort(self, request_id: str) -> None:
        """Abort a request: its stream gets the final (aborted) output and ends."""
        output = self._abort_here(request_id)
        if output is not None and request_id in self._streams:
            self._deliver([output])

    async def _stream(self, request: GenerateRequest, start) -> AsyncIterator[RequestOutput]:
        """Track `request`'s outputs, send `start` to the core, yield until it finishes."""
        request_id = request.request_id
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = stream
        self._output_processor.add_group(request_id, list(request.prompt_token_ids), request.params,
                                         request.num_resumed_output_tokens)
        self._unannounced.add(request_id)
        is_finished = is_refused = False
        try:
            self._send(start)
            while not is_finished:
                output = await stream.get()
                if isinstance(output, BaseException):
                    is_refused = isinstance(output, InvalidRequestError)
                    raise output
                is_finished = output.finished
                raise_if_failed(request_id, output)
                yield output
        finally:
            self._streams.pop(request_id, None)
            if not is_finished:
                self._abort_here(request_id)
            if is_refused and request_id in self._unannounced:
                self._unannounced.discard(request_id)  # the engine never had it
            else:
                self._announce(request_id)
                self._notify(self.observer and self.observer.on_stop, request_id)

    def _check_request(self, request: GenerateRequest) -> None:
        request_id = request.request_id
        if request_id in self._streams or self._output_processor.has_group(request_id):
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        if request.params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop", "stop strings need a tokenizer")

    def _abort_here(self, request_id: str) -> RequestOutput | None:
        output = self._output_processor.abort_group(request_id)
        if output is not None:
            self._send(AbortRequests([request_id]))
        return output

    # ---- disaggregation: the KV connector runs in the core ---------------------------------

    @property
    def on_reservation_event(self) -> Callable[[ReservationEvent], None] | None:
        """Told, on the event loop, each event of each reservation (after its `wait_kv`
        callers); a decode service's leases."""
        return self._kv_waits.listener

    @on_reservation_event.setter
    def on_reservation_event(self, listener: Callable[[ReservationEvent], None] | None) -> None:
        self._kv_waits.listener = listener

    async def reserve_kv(self, request: GenerateRequest, lease_s: float | None = None) -> KVReservation:
        """Reserve blocks until `lease_s` from now (None: until released); CapacityError when
        there is no room (the caller tries another instance)."""
        self._check_alive()
        request_id = request.request_id
        if request_id in self._reserved_prompts or request_id in self._streams:
            raise InvalidRequestError("request_id", f"{request_id!r} is already reserved or running")
        self._check_request(request)
        self._reserved_prompts[request_id] = request
        trace_context = inject_context()
        try:
            result = await self._call(lambda call_id: ReserveKV(
                call_id, request_id, list(request.prompt_token_ids), request.params, request.cache_salt,
                request.num_resumed_output_tokens, trace_context, request.lora_request, lease_s))
        except BaseException:
            self._reserved_prompts.pop(request_id, None)
            self._send(AbortRequests([request_id]))  # cancelled while the core reserved: free what it made
            raise
        return result.reservation

    async def renew_kv(self, request_id: str, lease_s: float) -> bool:
        """Move a reservation's deadline to `lease_s` from now; False if it has ended."""
        return (await self._call(lambda call_id: RenewKV(call_id, request_id, lease_s))).renewed

    async def wait_kv(self, request_id: str) -> None:
        """Returns once the reservation's KV arrived (at once if it has); KVTransferFailedError
        after a failed transfer (the connector waits for a retry) or when its lease ran out;
        InvalidRequestError when there is no such reservation."""
        await self._kv_waits.wait(request_id, lambda: self._kv_arrived(request_id))

    async def _kv_arrived(self, request_id: str) -> bool:
        return (await self._call(lambda call_id: Query(call_id, "kv_arrived", request_id))).kv_arrived

    async def generate_reserved(self, request_id: str, first_token_id: int,
                                first_logprobs: SampledLogprobs | None = None) -> AsyncIterator[RequestOutput]:
        """Decode a reservation whose KV arrived, from the producer's first token."""
        self._check_alive()
        request = self._take_reserved(request_id)
        start = StartReserved(request_id, first_token_id, first_logprobs)
        async with contextlib.aclosing(self._stream(request, start)) as outputs:
            async for output in outputs:
                yield output

    async def prefill_reserved(self, request_id: str) -> AsyncIterator[RequestOutput]:
        """Compute a reservation's prompt here instead of receiving its KV, then decode it."""
        self._check_alive()
        request = self._take_reserved(request_id)
        async with contextlib.aclosing(self._stream(request, PrefillReserved(request_id))) as outputs:
            async for output in outputs:
                yield output

    def _take_reserved(self, request_id: str) -> GenerateRequest:
        """Forget a reservation that is being decoded (or prefilled here); its prompt."""
        request = self._reserved_prompts.pop(request_id, None)
        if request is None:
            raise InvalidRequestError("request_id", f"{request_id!r} has no reservation")
        return request

    async def release_kv(self, request_id: str, keep_arrived: bool = False) -> bool:
        """Free a reservation that will not be decoded; False if there is none. With
        `keep_arrived`, KV that arrived into it joins the prefix cache first (a peer pull)."""
        self._reserved_prompts.pop(request_id, None)
        return (await self._call(lambda call_id: ReleaseKV(call_id, request_id, keep_arrived))).released

    async def send_cached(self, send: CachedSend) -> int:
        """Holder of a peer pull: start sending the prefix's blocks; how many are on their way."""
        return (await self._call(lambda call_id: SendCached(call_id, send))).num_blocks

    # ---- state -----------------------------------------------------------------------------

    def load(self) -> EngineLoad:
        """The load the core reported with its latest outputs, status or call result (no
        round trip): after a call such as `release_kv` returns, it counts what that call did."""
        return self._load

    def latest_status(self) -> EngineStatus:
        """The status the core last reported (with its outputs at most STATUS_INTERVAL_S apart
        while it steps, when it goes idle, and with every `status()`; no round trip)."""
        if self._status is None:
            raise EngineDeadError("the engine core has not reported its status yet")
        return self._status

    async def status(self) -> EngineStatus:
        status = (await self._call(lambda call_id: Query(call_id, "status"))).status
        self._status, self._load = status, status.load
        return status

    async def kv_events(self, snapshot: bool = False) -> KVCacheEvents:
        what = "kv_snapshot" if snapshot else "kv_events"
        return (await self._call(lambda call_id: Query(call_id, what))).kv_events

    async def memory(self) -> EngineMemory:
        return (await self._call(lambda call_id: Query(call_id, "memory"))).memory

    # ---- talking to the core ---------------------------------------------------------------

    async def _call(self, make_message) -> CallResult:
        """Send `make_message(call_id)` and wait for its CallResult; a refused call raises
        InvalidRequestError or CapacityError."""
        self._check_alive()
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        try:
            self._send(make_message(call_id))
            result = await future
        finally:
            self._calls.pop(call_id, None)
        if result.error_kind == "invalid":
            raise InvalidRequestError(result.error_field, result.error)
        if result.error_kind == "capacity":
            raise CapacityError(result.error)
        return result

    def _send(self, message) -> None:
        """Queue a message for the core (PUSH never blocks at these volumes); nothing once
        the core is gone (callers that wait for an answer checked `is_alive` first)."""
        if self.is_alive:
            self._connection.requests.send(encode(message), copy=False)

    async def _read_outputs(self, connection: CoreConnection) -> None:
        try:
            while True:
                data = await connection.outputs.recv(copy=False)
                self._handle(decode_core_message(data.buffer))
        except Exception:  # noqa: BLE001 - a core we cannot understand is ended; _watch reports it
            logger.exception("reading the engine core's outputs failed; ending it")
            self._last_words = "its outputs could not be read"
            self.transport.kill()

    def _handle(self, message: CoreMessage) -> None:
        if isinstance(message, StepOutputs):
            self._load = message.load
            self._status = message.status or self._status
            self._has_reported.set()
            self._process(message)
        elif isinstance(message, CallResult):
            if message.load is not None:
                self._load = message.load
            future = self._calls.get(message.call_id)
            if future is not None and not future.done():
                future.set_result(message)
        elif isinstance(message, Rejected):
            self._output_processor.abort_group(message.request_id)
            stream = self._streams.get(message.request_id)
            if stream is not None:
                stream.put_nowait(InvalidRequestError(message.field, message.message))
        elif isinstance(message, CoreFailed):
            self._last_words = message.error
        elif isinstance(message, Ready):
            logger.warning("ignoring a second Ready from the engine core")

    def _process(self, message: StepOutputs) -> None:
        for event in message.reservation_events:
            if event.kind == ReservationEventKind.EXPIRED:  # the core freed it
                self._reserved_prompts.pop(event.request_id, None)
            self._kv_waits.deliver(event)
        processed = self._output_processor.process(message.outputs)
        if processed.stopped_ids:
            self._send(FinishRequests(processed.stopped_ids, "stop"))
        for child_id, error in processed.failed.items():
            self._send(FinishRequests([child_id], "error", error))
        self._deliver(processed.request_outputs)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Outputs to the observer (announcing the streams it has not heard of), then to
        their streams."""
        if not outputs:
            return
        for output in outputs:
            self._announce(output.request_id)
        self._notify(self.observer and self.observer.on_outputs, outputs)
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.put_nowait(output)

    def _announce(self, request_id: str) -> None:
        if request_id in self._unannounced:
            self._unannounced.discard(request_id)
            self._notify(self.observer and self.observer.on_start, request_id)

    @staticmethod
    def _notify(hook, *args) -> None:
        """Call an observer or failure hook; its own failure is logged, never raised."""
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:  # noqa: BLE001 - metrics must not stop the outputs
            logger.exception("engine hook %s failed", getattr(hook, "__name__", hook))
