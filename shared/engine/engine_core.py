"""The engine core: scheduler + executor (+ guided decoding), stepping on token ids only.

It admits tokenized requests, steps, and returns token-level `EngineCoreOutput`s; it never
sees text. `LLMEngine` composes it with the `OutputProcessor` in one thread; the engine-core
process (shared.engine.core_process) runs it in a child process behind a message protocol.
A request's n completions are engine requests of their own ("<id>#<index>").
"""

import itertools
import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from shared.config import EngineConfig
from shared.core.kv_cache_manager import KVCacheManager
from shared.core.remote_kv import RemoteKVState
from shared.core.request import Request, RequestStatus
from shared.core.scheduler import Scheduler
from shared.core.scheduler_output import SchedulerOutput
from shared.engine.admission import max_output_tokens, validate_prompt_tokens
from shared.engine.core_outputs import EngineCoreOutput, child_request_id
from shared.engine.guided_decoding import GuidedDecoding
from shared.engine.peer_sends import PeerSends
from shared.engine.resume import resume_request, split_resumed
from shared.engine.stats import EngineStats
from shared.engine_api.client import CachedSend, KVReservation, ReservationEvent, ReservationEventKind
from shared.engine_api.errors import CapacityError
from shared.engine_api.outputs import SampledLogprobs
from shared.errors import InvalidRequestError
from shared.executor.base import Executor, ModelRunnerOutput
from shared.kv_cache.block_pool import BlockPool
from shared.kv_events.stream import KVEventStream
from shared.kv_tier.attach import TierHooks
from shared.kv_transfer.base import KVConnector
from shared.kv_transfer.factory import create_connector
from shared.kv_transfer.types import FinishedTransfers, KVSendParams, KVTransferOutcome
from shared.lora.registry import AdapterRegistry
from shared.lora.request import LoRARequest
from shared.model.config import ModelConfig
from shared.sampling.params import SamplingParams
from shared.spec_decode.stats import SpecDecodeStats

logger = logging.getLogger(__name__)


TRANSFER_TOKEN_BYTES = 16


class EngineCore:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, executor: Executor,
                 tokenizer=None, model_key: str = ""):
        """`tokenizer` serves guided decoding only (token bitmasks); None refuses guided requests."""
        self.config = config
        self.model_config = model_config
        self.executor = executor
        layout = executor.kv_cache_layout
        self.max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                                 model_config.max_position_embeddings)
        self.block_pool = BlockPool(layout.num_blocks)
        # KV-cache events for indexers outside pdserve (shared.kv_events; None when off).
        self.kv_events = KVEventStream(config.kv_events) if config.kv_events is not None else None
        if self.kv_events is not None:
            self.block_pool.kv_event_log = self.kv_events.log
        self.kv_manager = KVCacheManager(self.block_pool, layout.block_size, config.cache.enable_prefix_caching,
                                         config.cache.prefix_hash_algo, model_key)
        self.connector: KVConnector | None = None
        if config.kv_transfer is not None:
            self.connector = create_connector(config.kv_transfer, executor)
            self.connector.start()
        lora = config.lora if config.lora.enable_lora else None
        self.scheduler = Scheduler(config.scheduler, self.kv_manager, self.max_model_len,
                                   config.speculative.num_tokens_per_step, self.connector,
                                   lora.max_loras if lora else None)
        # LoRA adapters: admission checks and the block-hash key of each (shared.lora.registry).
        self.adapters = AdapterRegistry(lora, model_config)
        # KV tiers below the pool (shared.kv_tier; hooks that do nothing when there are none).
        self.tiers = TierHooks.attach(config.kv_tier, executor, self.kv_manager, config.model, config.deterministic)
        # Prefixes this engine sends to peers that pull them (shared.engine.peer_sends).
        self.peer_sends = PeerSends(self.kv_manager, self.connector)
        self.guided = GuidedDecoding(tokenizer, model_config.vocab_size, model_config.eos_token_ids, config.guided)
        self.stats = EngineStats(num_blocks_total=layout.num_blocks, block_size=layout.block_size,
                                 bytes_per_token=layout.bytes_per_block // layout.block_size)
        # Speculative decoding: drafts proposed and tokens accepted (stays zero when off).
        self.spec_stats = SpecDecodeStats()
        self._children: dict[str, list[Request]] = {}
        # Per engine request: its request id, and the output tokens reported so far (resumed
        # ones count as reported).
        self._group_of: dict[str, str] = {}
        self._num_reported: dict[str, int] = {}
        self._request_counter = itertools.count()
        # Submitted batches whose results are not applied yet, oldest first (see step).
        self._in_flight: deque[tuple[SchedulerOutput, dict[str, str]]] = deque()
        # Final outputs of requests whose KV the connector is still sending (emitted after;
        # their tokens went out at once, see _split_for_send).
        self._outputs_awaiting_send: dict[str, EngineCoreOutput] = {}
        # Requests whose KV send the last step started (finish_step_sends waits for them).
        self._sends_started_in_step: set[str] = set()
        # What happened to reservations (KV arrived, a transfer failed, timed out), not yet drained.
        self._reservation_events: list[ReservationEvent] = []
        # Called with each step's scheduler and runner outputs once applied (request tracing).
        self.step_listener: Callable[[SchedulerOutput, ModelRunnerOutput], None] | None = None

    def shutdown(self) -> None:
        """Release the KV connector and the executor (stops worker processes, if any)."""
        if self.connector is not None:
            self.connector.shutdown()
        self.tiers.close()
        if self.kv_events is not None:
            self.kv_events.close()
        self.executor.shutdown()

    def new_request_id(self) -> str:
        return str(next(self._request_counter))

    # ---- requests ------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    cache_salt: str | None = None, num_resumed_output_tokens: int = 0,
                    kv_send: KVSendParams | None = None, lora_request: LoRARequest | None = None) -> list[Request]:
        """Validate and queue a tokenized request (InvalidRequestError naming the field);
        returns its engine requests, one per completion. See LLMEngine.add_request."""
        if kv_send is not None:
            self._check_kv_send(params)
        children = self._new_request(prompt_token_ids, params, request_id, cache_salt, num_resumed_output_tokens,
                                     lora_request)
        for child in children:
            child.kv_send = kv_send
            self.scheduler.add_request(child)
        return children

    def _check_kv_send(self, params: SamplingParams) -> None:
        if self.connector is None or not self.connector.role.is_producer:
            raise InvalidRequestError("kv_send", "this engine's KV connector does not send KV")
        if params.n != 1:
            raise InvalidRequestError("n", "disaggregated requests generate one completion each")

    def _new_request(self, token_ids: list[int], params: SamplingParams, request_id: str, cache_salt,
                     num_resumed_output_tokens: int = 0, lora_request: LoRARequest | None = None) -> list[Request]:
        if request_id in self._children:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        validate_prompt_tokens(token_ids, self.model_config.vocab_size, self.max_model_len)
        params.validate(self.model_config.vocab_size)
        adapter_key = self.adapters.admit(lora_request)
        token_ids, resumed = split_resumed(list(token_ids), num_resumed_output_tokens, params)
        layout = self.executor.kv_cache_layout
        max_out = max_output_tokens(len(token_ids), params, self.max_model_len, layout.num_blocks, layout.block_size)
        children = self._make_children(request_id, token_ids, params, max_out, cache_salt)
        for child in children:
            child.lora_request, child.adapter_key = lora_request, adapter_key
        self.guided.admit(children)
        if resumed:
            resume_request(children[0], resumed)
        self._children[request_id] = children
        for child in children:
            self._group_of[child.request_id] = request_id
            self._num_reported[child.request_id] = child.num_output_tokens
        return children

    def _make_children(self, request_id, token_ids, params, max_out, cache_salt) -> list[Request]:
        children = []
        for index in range(params.n):
            child_params = params
            if index > 0 and params.seed is not None:
                child_params = replace(params, seed=params.seed + index)
            children.append(Request(
                child_request_id(request_id, index, params.n), token_ids, child_params,
                eos_token_ids=tuple(self.model_config.eos_token_ids), max_output_tokens=max_out,
                cache_salt=cache_salt, prompt_parent=children[0] if children else None))
        return children

    def abort_request(self, request_id: str) -> bool:
        """Stop a request and free its blocks at once; False if it was not live. A request
        whose KV is being sent has no output left to give: the send is abandoned, its blocks
        freed when the connector reports it ended, and its final output (failed send) comes
        then."""
        if request_id in self._outputs_awaiting_send:
            self.scheduler.abort([request_id])
            return False
        children = self._children.pop(request_id, None)
        if children is None:
            return False
        self.scheduler.abort([child.request_id for child in children])
        self._forget_children(children)
        return True

    def finish_requests(self, child_ids: list[str], status: RequestStatus, error: str | None = None) -> None:
        """End engine requests the output processor ended (a stop string: FINISHED_STOPPED;
        a failed text pipeline: FINISHED_ERROR). Unknown or finished ids are ignored."""
        for child_id in child_ids:
            request = self.scheduler.requests.get(child_id)
            if request is not None and not request.is_finished:
                request.error = error
                self.scheduler.finish(request, status)
        self._forget_finished_groups(self._groups_of(child_ids))

    def has_unfinished_requests(self) -> bool:
        """Requests not finished yet, counting those whose KV is still being sent and those
        waiting for their KV from elsewhere."""
        return bool(self._children)

    def requests_of(self, request_id: str) -> list[Request]:
        """The engine requests (one per completion of n) behind a request id; [] once it ended."""
        return list(self._children.get(request_id, ()))

    # ---- disaggregation: the KV connector ships prompts' KV and receives it ------------------

    def reserve_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                        cache_salt: str | None = None, num_resumed_output_tokens: int = 0,
                        lora_request: LoRARequest | None = None, lease_s: float | None = None) -> KVReservation:
        """Decode role: see LLMEngine.reserve_request; the scheduler times the reservation out
        `lease_s` from now unless renewed (None: never; the caller releases). Raises
        CapacityError when there is no room."""
        if params.n != 1:
            raise InvalidRequestError("n", "disaggregated requests generate one completion each")
        [request] = self._new_request(list(prompt_token_ids), params, request_id, cache_salt,
                                      num_resumed_output_tokens, lora_request)
        token = secrets.token_bytes(TRANSFER_TOKEN_BYTES)
        try:
            admitted = self.scheduler.admit_with_remote_kv(request, token, lease_s)
        except BaseException:
            self._forget_request(request_id)
            raise
        if not admitted:
            self._forget_request(request_id)
            raise CapacityError(f"no room for {request.num_prompt_tokens} prompt tokens")
        return KVReservation(request_id, tuple(self.kv_manager.block_ids(request_id)), request.num_cached_prompt_tokens,
                             request.num_cached_prompt_tokens // self.kv_manager.block_size, self.connector.address,
                             token)

    def renew_reserved(self, request_id: str, lease_s: float) -> bool:
        """Decode role: move a reservation's deadline to `lease_s` from now; False if it ended."""
        return self.scheduler.renew_remote_kv(request_id, lease_s)

    def reservation_state(self, request_id: str) -> RemoteKVState | None:
        """Where a reservation stands (shared.core.remote_kv); None once it ended (or never was)."""
        request = self.scheduler.waiting_for_remote_kv.get(request_id)
        return request.remote_kv.state if request is not None else None

    def start_reserved(self, request_id: str, first_token_id: int,
                       first_logprobs: SampledLogprobs | None = None) -> list[EngineCoreOutput]:
        """Decode role: the prompt's KV arrived into the reserved blocks; start decoding after
        the producer's first token (InvalidRequestError when it has not arrived)."""
        if not 0 <= first_token_id < self.model_config.vocab_size:
            raise InvalidRequestError("first_token_id", f"{first_token_id} is outside the vocabulary "
                                                        f"[0, {self.model_config.vocab_size})")
        request = self.scheduler.start_after_remote_kv(request_id, first_token_id)
        self._finish_guided([request])
        logprobs = {request_id: first_logprobs} if first_logprobs is not None else {}
        return self._make_outputs([request], ModelRunnerOutput(logprobs=logprobs))

    def prefill_reserved(self, request_id: str) -> None:
        """Decode role: compute a reservation's prompt in this engine instead of receiving its
        KV (conditional disaggregation), then decode it; its outputs come from the steps."""
        self.scheduler.compute_reserved(request_id)

    def release_reserved(self, request_id: str, keep_arrived: bool = False) -> bool:
        """Decode role: free a reservation that will not be decoded; False if there is none.
        With `keep_arrived` (a peer pull), KV that arrived joins the prefix cache first."""
        if not self.scheduler.release_remote_kv(request_id, keep_arrived):
            return False
        self._forget_request(request_id)
        return True

    def seconds_to_next_deadline(self) -> float:
        """How long an idle loop may wait before a reservation times out (math.inf: none)."""
        return self.scheduler.seconds_to_next_deadline()

    def send_cached(self, send: CachedSend) -> int:
        """Holder of a peer pull: see shared.engine.peer_sends."""
        return self.peer_sends.start(send)

    def poll_kv_transfers(self) -> list[EngineCoreOutput]:
        """Apply the transfers the connector finished (sent blocks are freed and their requests'
        final outputs returned; received KV is committed into its reservation), then time out
        the reservations whose deadline passed."""
        if self.connector is None:
            return []
        finished: FinishedTransfers = self.connector.get_finished()
        for outcome in finished.receiving:
            self._on_kv_received(outcome)
        outputs = [output for outcome in finished.sending if (output := self._on_kv_sent(outcome)) is not None]
        for request in self.scheduler.expire_remote_kv():
            self._forget_request(request.request_id)
            num_failed = request.remote_kv.num_failed_transfers
            logger.warning("reservation %s timed out (%d failed transfers); its blocks are freed", request.request_id,
                           num_failed, extra={"request_id": request.request_id})
            self._reservation_events.append(ReservationEvent(request.request_id, ReservationEventKind.EXPIRED,
                                                             num_failed_transfers=num_failed))
        return outputs

    def drain_reservation_events(self) -> list[ReservationEvent]:
        """What happened to reservations since the last call, in order (the engine clients pass
        these to `wait_kv` callers and to the service's listener)."""
        events, self._reservation_events = self._reservation_events, []
        return events

    def _on_kv_received(self, outcome: KVTransferOutcome) -> None:
        request = self.scheduler.on_remote_kv_transfer(outcome.request_id, outcome.error)
        if request is None:
            return  # released, started or timed out meanwhile
        remote_kv = request.remote_kv
        if remote_kv.state == RemoteKVState.ARRIVED:
            num_skip = request.num_cached_prompt_tokens // self.kv_manager.block_size
            self.executor.commit_received_blocks(self.kv_manager.block_ids(request.request_id)[num_skip:])
            kind = ReservationEventKind.ARRIVED
        else:
            logger.warning("KV transfer for %s failed (%s); waiting for a retry", outcome.request_id, outcome.error,
                           extra={"request_id": outcome.request_id})
            kind = ReservationEventKind.TRANSFER_FAILED
        self._reservation_events.append(ReservationEvent(outcome.request_id, kind, outcome.error,
                                                         remote_kv.num_failed_transfers))

    def _on_kv_sent(self, outcome: KVTransferOutcome) -> EngineCoreOutput | None:
        if self.peer_sends.finish(outcome):
            return None
        self.scheduler.finish_sending(outcome.request_id)
        output = self._outputs_awaiting_send.pop(outcome.request_id, None)
        self._forget_finished_groups(self._groups_of([outcome.request_id]))
        if output is None:
            return None
        output.kv_transfer, output.kv_transfer_error = outcome.result, outcome.error
        return output

    def _forget_request(self, request_id: str) -> None:
        children = self._children.pop(request_id, [])
        self._forget_children(children)

    # ---- one step ------------------------------------------------------------------------

    def step(self) -> list[EngineCoreOutput]:
        """One engine step (`_step`), then its KV-cache events to the publisher (when on)."""
        outputs = self._step()
        if self.kv_events is not None:
            self.kv_events.flush()
        return outputs

    def _step(self) -> list[EngineCoreOutput]:
        """One engine step. A request whose own computation fails (guided mask, sampling,
        logprobs, speculation) finishes alone with finish reason "error"; only a failure of
        the step as a whole (the forward pass) raises. Transfers the KV connector finished
        are applied first; with nothing to compute, that is all it does. A prompt whose KV
        the step started sending has its first token in these outputs already; its final
        output follows once the send ended (`finish_step_sends`, or a later poll)."""
        self._sends_started_in_step = set()
        sent = self.poll_kv_transfers()
        if not self.scheduler.num_unfinished and not self._in_flight:
            return sent
        awaiting_send = set(self._outputs_awaiting_send)
        if self.connector is not None:
            self.connector.start_load_kv()
        if self.executor.max_concurrent_batches > 1:
            outputs = self._step_with_batches_in_flight()
        else:
            scheduler_output, failed = self._schedule()
            outputs = self._apply(scheduler_output, failed, self.executor.execute_model(scheduler_output))
        if self.connector is not None:
            self.connector.wait_for_save()
            self._sends_started_in_step = self._outputs_awaiting_send.keys() - awaiting_send
        return sent + outputs

    def finish_step_sends(self) -> list[EngineCoreOutput]:
        """The final outputs of requests whose KV send the last step started and that end
        within the connector's `send_wait_s` (a few ms on a fast link). Called once the
        step's outputs were handed out (their first tokens travel meanwhile); otherwise the
        final outputs would go out after the next step: new requests may already wait in
        the service's queue, and their compute can take a whole prompt's time."""
        started, self._sends_started_in_step = self._sends_started_in_step, set()
        if not started:
            return []
        self.connector.wait_for_sends(started, self.connector.config.send_wait_s)
        return self.poll_kv_transfers()

    def _schedule(self) -> tuple[SchedulerOutput, dict[str, str]]:
        """The next batch, and the requests whose guided masks failed (by id, with the error)."""
        scheduler_output = self.scheduler.schedule()
        self.stats.record_schedule(scheduler_output, self.scheduler, self.block_pool)
        self.tiers.scheduled(scheduler_output)
        failed = self.guided.prepare_step(scheduler_output.scheduled, self.scheduler.requests)
        return scheduler_output, failed

    def _step_with_batches_in_flight(self) -> list[EngineCoreOutput]:
        """Pipeline parallelism: submit a new batch (of requests not already computing) while
        earlier ones are still in the pipeline, so its stages overlap across steps; collect the
        oldest batch once the executor's limit is reached or nothing new could be scheduled."""
        limit = self.executor.max_concurrent_batches
        if len(self._in_flight) < limit:
            scheduler_output, failed = self._schedule()
            if (scheduler_output.scheduled or scheduler_output.finished_request_ids
                    or scheduler_output.preempted_request_ids or failed):
                self.executor.submit_batch(scheduler_output)
                self._in_flight.append((scheduler_output, failed))
                self.scheduler.in_flight.update(item.request_id for item in scheduler_output.scheduled)
                if scheduler_output.scheduled and len(self._in_flight) < limit:
                    return []
        if not self._in_flight:
            return []
        scheduler_output, failed = self._in_flight.popleft()
        runner_output = self.executor.collect_batch()
        self.scheduler.in_flight.difference_update(item.request_id for item in scheduler_output.scheduled)
        return self._apply(scheduler_output, failed, runner_output)

    def _apply(self, scheduler_output: SchedulerOutput, failed: dict[str, str],
               runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        self.tiers.applied(scheduler_output)
        if self.step_listener is not None:
            self.step_listener(scheduler_output, runner_output)
        failed_requests = self._fail_requests({**failed, **runner_output.failed})
        updated = self.scheduler.update_from_output(scheduler_output, runner_output.sampled_token_ids,
                                                    runner_output.verified)
        for verified in runner_output.verified.values():
            self.spec_stats.record(verified.num_draft_tokens, verified.num_accepted)
        self._finish_guided(updated)
        return self._make_outputs(failed_requests + updated, runner_output)

    def _fail_requests(self, errors: dict[str, str]) -> list[Request]:
        """Finish each still-live request in `errors` (request id -> message) with an error."""
        failed = []
        for request_id, message in errors.items():
            request = self.scheduler.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            logger.warning("request %s failed: %s", request_id, message, extra={"request_id": request_id})
            request.error = message
            self.scheduler.finish(request, RequestStatus.FINISHED_ERROR)
            failed.append(request)
        return failed

    def _finish_guided(self, updated: list[Request]) -> None:
        """Advance guided requests' matchers with their new tokens; end those that are done."""
        for request, status in self.guided.advance(updated):
            self.scheduler.finish(request, status)

    # ---- outputs -------------------------------------------------------------------------

    def _make_outputs(self, updated: list[Request], runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """One output per request that got tokens, finished, or scored prompt positions."""
        outputs = {request.request_id: self._output_of(request, runner_output) for request in updated}
        for request_id, entries in runner_output.prompt_logprobs.items():
            output = outputs.setdefault(request_id, EngineCoreOutput(request_id))
            output.new_prompt_logprobs = list(entries)
        self.stats.record_tokens(sum(len(output.new_token_ids) for output in outputs.values()))
        for request_id in [request_id for request_id, output in outputs.items()
                           if output.finished and request_id in self.scheduler.sending]:
            self._split_for_send(outputs, request_id)
        self._forget_finished_groups(self._groups_of([request.request_id for request in updated]))
        return list(outputs.values())

    def _split_for_send(self, outputs: dict[str, EngineCoreOutput], request_id: str) -> None:
        """A request that finished while the connector sends its KV: its new tokens (a prefill's
        first token, with logprobs and prompt logprobs) go out now, unfinished, so that they
        reach the client while the KV travels; its finish is held until the send ended and
        then says what moved."""
        output = outputs[request_id]
        self._outputs_awaiting_send[request_id] = EngineCoreOutput(
            request_id, finish_reason=output.finish_reason, stop_reason=output.stop_reason,
            num_cached_tokens=output.num_cached_tokens, first_scheduled_time=output.first_scheduled_time)
        if output.new_token_ids or output.new_prompt_logprobs:
            output.finish_reason = output.stop_reason = None
        else:
            del outputs[request_id]

    def _output_of(self, request: Request, runner_output: ModelRunnerOutput) -> EngineCoreOutput:
        num_reported = self._num_reported.get(request.request_id, request.num_output_tokens)
        new_token_ids = request.output_token_ids[num_reported:]
        self._num_reported[request.request_id] = request.num_output_tokens
        logprobs = runner_output.logprobs.get(request.request_id)
        output = EngineCoreOutput(request.request_id, new_token_ids, num_cached_tokens=request.num_cached_prompt_tokens,
                                  first_scheduled_time=request.first_scheduled_time)
        if request.sampling_params.logprobs is not None and logprobs is not None:
            output.new_logprobs = [logprobs] * len(new_token_ids)
        if request.is_finished:
            output.finish_reason = request.status.finish_reason
            output.stop_reason = request.stop_reason
            output.error = request.error if request.status == RequestStatus.FINISHED_ERROR else None
        return output

    def _forget_finished_groups(self, request_ids: set[str]) -> None:
        """Drop the bookkeeping of requests whose completions have all finished (and whose
        KV, if any, has been sent)."""
        for request_id in request_ids:
            children = self._children.get(request_id)
            if children is not None and all(child.is_finished and child.request_id not in self.scheduler.sending
                                            for child in children):
                del self._children[request_id]
                self._forget_children(children)
                self.stats.record_finished(children[0].num_cached_prompt_tokens)

    def _groups_of(self, child_ids: list[str]) -> set[str]:
        return {self._group_of[child_id] for child_id in child_ids if child_id in self._group_of}

    def _forget_children(self, children: list[Request]) -> None:
        for child in children:
            self._group_of.pop(child.request_id, None)
            self._num_reported.pop(child.request_id, None)
