"""The service side of the engine-core process: an EngineClient (shared.engine_api.client) whose
scheduler and executor run in a child process.

The service process keeps the text work: requests go to the core as token ids; the core's
token outputs come back after every step and the `OutputProcessor` here turns them into
`RequestOutput`s (detokenization, stop strings, n > 1 groups) while the core computes its next
step. A stop string ends the completion here and tells the core to finish that request.

A crash of the core (a Python exception, a segfault, SIGKILL) is seen at once through the
child's exit (not a timeout): every stream and query in flight fails with EngineDeadError
naming how it died, `is_alive` turns False and the `on_death` callbacks run. `restart()`
starts a fresh core (the model is loaded again); requests of the dead core are gone with it.
"""

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable

import zmq
import zmq.asyncio

from shared.config import EngineConfig
from shared.engine.core_process.messages import (AbortRequests, AddRequest, CallResult, CoreFailed, CoreMessage,
                                                 FinishRequests, PrefillReserved, Query, Ready, Rejected, ReleaseKV,
                                                 RenewKV, ReserveKV, SendCached, Shutdown, StartReserved, StepOutputs,
                                                 decode_core_message, encode)
from shared.engine.core_process.spawn import CoreHandle, describe_exit, spawn_core
from shared.engine.kv_waits import KVWaits
from shared.engine.output_processor import OutputProcessor
from shared.engine_api.client import (CachedSend, CapacityError, EngineDeadError, EngineInfo, EngineLoad, EngineMemory,
                                      EngineStatus, GenerateRequest, KVCacheEvents, KVReservation, ReservationEvent,
                                      ReservationEventKind, raise_if_failed)
from shared.engine_api.outputs import RequestOutput, SampledLogprobs
from shared.errors import InvalidRequestError
from shared.memory.idle_trim import TrimPolicy
from shared.tracing import inject_context

logger = logging.getLogger(__name__)


DEFAULT_STARTUP_TIMEOUT_S = 600.0
SHUTDOWN_TIMEOUT_S = 10.0


class CoreProcessClient:
    def __init__(self, config: EngineConfig, tokenizer=None, trim_policy: TrimPolicy = TrimPolicy(),
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S):
        """`tokenizer`: the model's, for detokenization and stop strings (None: token ids only)."""
        self.config = config
        self.tokenizer = tokenizer
        self.trim_policy = trim_policy
        self.startup_timeout_s = startup_timeout_s
        self.info: EngineInfo | None = None
        # Called on the event loop when the core dies, before the streams fail.
        self.on_failure: Callable[[BaseException], None] | None = None
        # Sees each streamed request start, every output dispatched, and each stream's end.
        self.observer = None
        self.num_starts = 0
        self._core: CoreHandle | None = None
        self._tasks: list[asyncio.Task] = []
        self._streams: dict[str, asyncio.Queue] = {}
        self._calls: dict[int, asyncio.Future] = {}
        # Reservations in the core, with the prompts they were made for (their output
        # processing starts when Decode takes them); the core's scheduler owns their state.
        self._reserved_prompts: dict[str, GenerateRequest] = {}
        self._kv_waits = KVWaits()
        self._call_ids = itertools.count()
        self._output_processor = OutputProcessor(tokenizer)
        self._load = EngineLoad(0, 0, 0, 0, 0)
        self._status: EngineStatus | None = None
        self._last_words: str | None = None
        self._is_stopping = False
        self.error: EngineDeadError | None = None

    # ---- life ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the core and wait until it is loaded (EngineDeadError if it dies first)."""
        self._is_stopping = False
        self.error = None
        self._last_words = None
        core = await spawn_core(self.config, self.trim_policy, self.startup_timeout_s)
        self._core, self.info, self.num_starts = core, core.ready.info, self.num_starts + 1
        self._load = EngineLoad(0, 0, 0, self.info.num_blocks, self.info.num_blocks)
        self._output_processor = OutputProcessor(self.tokenizer)
        self._tasks = [asyncio.create_task(self._read_outputs(core), name="engine-core-outputs"),
                       asyncio.create_task(self._watch(core), name="engine-core-watch")]
        logger.info("engine core process %d ready: %d KV blocks of %d tokens", core.process.pid,
                    self.info.num_blocks, self.info.cache.block_size)

    async def restart(self) -> None:
        """After the core died: start a fresh one."""
        await self.stop()
        await self.start()

    async def stop(self) -> None:
        """Shut the core down (killed after SHUTDOWN_TIMEOUT_S); streams still open fail."""
        core, self._core = self._core, None
        if core is None:
            return
        self._is_stopping = True
        if core.process.returncode is None:
            with contextlib.suppress(zmq.ZMQError):
                await core.requests.send(encode(Shutdown()))
            try:
                await asyncio.wait_for(core.process.wait(), SHUTDOWN_TIMEOUT_S)
            except asyncio.TimeoutError:
                logger.warning("engine core %d did not stop in time; killing it", core.process.pid)
                core.process.kill()
                await core.process.wait()
        self._fail_everything(self.error or EngineDeadError("the engine is stopped"))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        core.close()

    @property
    def is_alive(self) -> bool:
        return self._core is not None and self.error is None and not self._is_stopping

    @property
    def pid(self) -> int | None:
        return self._core.process.pid if self._core is not None else None

    async def _watch(self, core: CoreHandle) -> None:
        returncode = await core.process.wait()
        if self._is_stopping or self._core is not core:
            return
        how = describe_exit(returncode)
        reason = f": {self._last_words}" if self._last_words else ""
        self._die(EngineDeadError(f"the engine core process {core.process.pid} {how}{reason}"))

    def _die(self, error: EngineDeadError) -> None:
        """Callbacks first (the service turns NOT_SERVING), then the streams fail."""
        logger.error("%s", error)
        self.error = error
        self._notify(self.on_failure, error)
        self._fail_everything(error)

    def _fail_everything(self, error: EngineDeadError) -> None:
        for stream in self._streams.values():
            stream.put_nowait(error)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()
        self._kv_waits.fail_all(error)
        self._reserved_prompts.clear()
        self._output_processor = OutputProcessor(self.tokenizer)
        self._load = EngineLoad(0, 0, 0, self._load.num_free_blocks, self._load.num_total_blocks)

    # ---- requests --------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """Queue the request in the core and stream its outputs until it finishes; closing the
        stream early aborts it. InvalidRequestError for bad input, RequestFailedError when
        this request failed, KVTransferFailedError when its KV could not be sent,
        EngineDeadError when the core died."""
        self._check_alive()
        self._check_request(request)
        message = AddRequest(request.request_id, list(request.prompt_token_ids), request.params, request.cache_salt,
                             request.num_resumed_output_tokens, request.kv_send, inject_context(),
                             request.lora_request)
        async for output in self._stream(request, message):
            yield output

    async def _stream(self, request: GenerateRequest, start) -> AsyncIterator[RequestOutput]:
        """Track `request`'s outputs, send `start` to the core, yield until it finishes."""
        request_id = request.request_id
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = stream
        self._output_processor.add_group(request_id, list(request.prompt_token_ids), request.params,
                                         request.num_resumed_output_tokens)
        if self.observer is not None:
            self._notify(self.observer.on_start, request_id)
        finished = False
        try:
            self._send(start)
            while not finished:
                output = await stream.get()
                if isinstance(output, BaseException):
                    raise output
                finished = output.finished
                raise_if_failed(request_id, output)
                yield output
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._abort_here(request_id)
            if self.observer is not None:
                self._notify(self.observer.on_stop, request_id)

    def _check_request(self, request: GenerateRequest) -> None:
        if request.request_id in self._streams or self._output_processor.has_group(request.request_id):
            raise InvalidRequestError("request_id", f"{request.request_id!r} is already running")
        if request.params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop", "stop strings need a tokenizer")

    @staticmethod
    def _notify(hook, *args) -> None:
        """Call an observer or failure hook; its own failure is logged, never raised."""
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:  # noqa: BLE001 - metrics must not stop the outputs
            logger.exception("engine hook %s failed", getattr(hook, "__name__", hook))

    async def abort(self, request_id: str) -> None:
        """Abort a request: its stream gets the final (aborted) output and ends."""
        output = self._abort_here(request_id)
        stream = self._streams.get(request_id)
        if output is not None and stream is not None:
            stream.put_nowait(output)

    def _abort_here(self, request_id: str) -> RequestOutput | None:
        output = self._output_processor.abort_group(request_id)
        if output is not None and self.is_alive:
            self._send(AbortRequests([request_id]))
        return output

    # ---- disaggregation: the KV connector runs in the core ---------------------------------

    @property
    def on_reservation_event(self) -> Callable[[ReservationEvent], None] | None:
        return self._kv_waits.listener

    @on_reservation_event.setter
    def on_reservation_event(self, listener: Callable[[ReservationEvent], None] | None) -> None:
        self._kv_waits.listener = listener

    async def reserve_kv(self, request: GenerateRequest, lease_s: float | None = None) -> KVReservation:
        """CapacityError when there is no room (the caller tries another instance)."""
        self._check_alive()
        request_id = request.request_id
        if request_id in self._reserved_prompts or request_id in self._streams:
            raise InvalidRequestError("request_id", f"{request_id!r} is already reserved or running")
        self._reserved_prompts[request_id] = request
        trace_context = inject_context()
        try:
            result = await self._call(lambda call_id: ReserveKV(
                call_id, request_id, list(request.prompt_token_ids), request.params, request.cache_salt,
                request.num_resumed_output_tokens, trace_context, request.lora_request, lease_s))
        except BaseException:
            self._reserved_prompts.pop(request_id, None)
            if self.is_alive:  # cancelled while the core reserved: free what it may have made
                self._send(AbortRequests([request_id]))
            raise
        return result.reservation

    async def renew_kv(self, request_id: str, lease_s: float) -> bool:
        """Move a reservation's deadline to `lease_s` from now; False if it has ended."""
        return (await self._call(lambda call_id: RenewKV(call_id, request_id, lease_s))).renewed

    async def wait_kv(self, request_id: str) -> None:
        """Returns once the reservation's KV arrived; KVTransferFailedError after a failed
        transfer (the connector waits for a retry) or when its lease ran out."""
        await self._kv_waits.wait(request_id, lambda: self._kv_arrived(request_id))

    async def _kv_arrived(self, request_id: str) -> bool:
        return (await self._call(lambda call_id: Query(call_id, "kv_arrived", request_id))).kv_arrived

    async def generate_reserved(self, request_id: str, first_token_id: int,
                                first_logprobs: SampledLogprobs | None = None) -> AsyncIterator[RequestOutput]:
        """Decode a reservation whose KV arrived, from the producer's first token."""
        self._check_alive()
        request = self._reserved_prompts.pop(request_id, None)
        if request is None:
            raise InvalidRequestError("request_id", f"{request_id!r} has no reservation")
        async for output in self._stream(request, StartReserved(request_id, first_token_id, first_logprobs)):
            yield output

    async def prefill_reserved(self, request_id: str) -> AsyncIterator[RequestOutput]:
        """Compute a reservation's prompt here instead of receiving its KV, then decode it."""
        self._check_alive()
        request = self._reserved_prompts.pop(request_id, None)
        if request is None:
            raise InvalidRequestError("request_id", f"{request_id!r} has no reservation")
        async for output in self._stream(request, PrefillReserved(request_id)):
            yield output

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
        """The load the core reported with its latest step (no round trip)."""
        return self._load

    def latest_status(self) -> EngineStatus:
        """The status the core last sent along with its outputs (at most STATUS_INTERVAL_S old
        while it steps; no round trip)."""
        if self._status is None:
            raise EngineDeadError("the engine core has not reported its status yet")
        return self._status

    async def status(self) -> EngineStatus:
        return (await self._call(lambda call_id: Query(call_id, "status"))).status

    async def kv_events(self, snapshot: bool = False) -> KVCacheEvents:
        what = "kv_snapshot" if snapshot else "kv_events"
        return (await self._call(lambda call_id: Query(call_id, what))).kv_events

    async def memory(self) -> EngineMemory:
        return (await self._call(lambda call_id: Query(call_id, "memory"))).memory

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

    # ---- the core's outputs ------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self.error is not None:
            raise self.error
        if not self.is_alive:
            raise EngineDeadError("the engine is stopped")

    def _send(self, message) -> None:
        """Queue a message for the core (PUSH never blocks at these volumes); nothing once
        the core is dead (callers that wait for an answer checked `is_alive` first)."""
        if self._core is not None and self.error is None:
            self._core.requests.send(encode(message), copy=False)

    async def _read_outputs(self, core: CoreHandle) -> None:
        try:
            while True:
                data = await core.outputs.recv(copy=False)
                self._handle(decode_core_message(data.buffer))
        except Exception:  # noqa: BLE001 - a core we cannot understand is killed; _watch reports it
            logger.exception("reading the engine core's outputs failed; killing it")
            self._last_words = "its outputs could not be read"
            core.process.kill()

    def _handle(self, message: CoreMessage) -> None:
        if isinstance(message, StepOutputs):
            self._load = message.load
            self._status = message.status or self._status
            self._process(message)
        elif isinstance(message, CallResult):
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
            if event.kind == ReservationEventKind.EXPIRED:
                self._reserved_prompts.pop(event.request_id, None)
            self._kv_waits.deliver(event)
        processed = self._output_processor.process(message.outputs)
        if processed.stopped_ids:
            self._send(FinishRequests(processed.stopped_ids, "stop"))
        for child_id, error in processed.failed.items():
            self._send(FinishRequests([child_id], "error", error))
        if self.observer is not None and processed.request_outputs:
            self._notify(self.observer.on_outputs, processed.request_outputs)
        for output in processed.request_outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.put_nowait(output)
