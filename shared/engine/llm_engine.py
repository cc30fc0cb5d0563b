"""The engine's step API: add requests, step, abort, read outputs.

Services drive it from one thread; the offline `LLM` wraps it in a loop. No transport code.
"""

import itertools
import logging
from collections import deque
from dataclasses import dataclass, replace

import torch

from shared.config import EngineConfig
from shared.core.kv_cache_manager import KVCacheManager
from shared.core.request import Request, RequestStatus
from shared.core.scheduler import Scheduler
from shared.core.scheduler_output import SchedulerOutput
from shared.engine.admission import max_output_tokens, validate_prompt_tokens
from shared.engine.guided_decoding import GuidedDecoding
from shared.engine.output_processor import OutputProcessor
from shared.engine.outputs import RequestOutput
from shared.engine.resume import resume_request, split_resumed
from shared.engine.stats import EngineStats
from shared.errors import InvalidRequestError
from shared.executor.base import Executor, ModelRunnerOutput, SampledLogprobs
from shared.kv_cache.block_pool import BlockPool
from shared.model.config import ModelConfig
from shared.sampling.params import SamplingParams
from shared.spec_decode.stats import SpecDecodeStats

logger = logging.getLogger(__name__)


class CapacityError(RuntimeError):
    """The engine has no room for the request now (blocks or sequence slots)."""


@dataclass
class Reservation:
    # The request's whole block table; the first num_cached_tokens // block_size blocks
    # already hold the prompt's KV (decode-side prefix-cache hits) and need not be sent.
    block_ids: list[int]
    num_cached_tokens: int


class LLMEngine:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, executor: Executor,
                 tokenizer=None, model_key: str = ""):
        self.config = config
        self.model_config = model_config
        self.executor = executor
        self.tokenizer = tokenizer
        layout = executor.kv_cache_layout
        self.max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                                 model_config.max_position_embeddings)
        self.block_pool = BlockPool(layout.num_blocks)
        self.kv_manager = KVCacheManager(self.block_pool, layout.block_size, config.cache.enable_prefix_caching,
                                         config.cache.prefix_hash_algo, model_key)
        self.scheduler = Scheduler(config.scheduler, self.kv_manager, self.max_model_len,
                                   config.speculative.num_tokens_per_step)
        self.output_processor = OutputProcessor(tokenizer)
        self.guided = GuidedDecoding(tokenizer, model_config.vocab_size, model_config.eos_token_ids, config.guided)
        self.stats = EngineStats(num_blocks_total=layout.num_blocks, block_size=layout.block_size,
                                 bytes_per_token=layout.bytes_per_block // layout.block_size)
        # Speculative decoding: drafts proposed and tokens accepted (stays zero when off).
        self.spec_stats = SpecDecodeStats()
        self._children: dict[str, list[Request]] = {}
        self._request_counter = itertools.count()
        # Submitted batches whose results are not applied yet, oldest first (see step).
        self._in_flight: deque[tuple[SchedulerOutput, dict[str, str]]] = deque()

    @classmethod
    def from_config(cls, config: EngineConfig) -> "LLMEngine":
        from shared.engine.loading import build_engine_parts
        return cls(config, *build_engine_parts(config))

    def shutdown(self) -> None:
        """Release the executor (stops worker processes, if any)."""
        self.executor.shutdown()

    # ---- requests ------------------------------------------------------------------------

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError("prompt", "text prompts need a tokenizer; pass token ids")
            from shared.tokenization.tokenizer import encode_prompt
            return encode_prompt(self.tokenizer, prompt)
        return list(prompt)

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, cache_salt: str | None = None,
                    hold_blocks_on_finish: bool = False, num_resumed_output_tokens: int = 0) -> str:
        """Validate and queue a request; returns its id. Raises InvalidRequestError.

        With `hold_blocks_on_finish` (prefill role) the request's blocks outlive it until
        `release_request`, so its KV can be shipped first. With `num_resumed_output_tokens`
        (migration) the prompt's last tokens are outputs generated elsewhere already: they
        count toward max_tokens, min_tokens and penalties, advance the grammar and the seeded
        generator, and are not emitted again."""
        request_id = request_id if request_id is not None else str(next(self._request_counter))
        for child in self._new_request(prompt, params, request_id, cache_salt, num_resumed_output_tokens):
            child.hold_blocks_on_finish = hold_blocks_on_finish
            self.scheduler.add_request(child)
        return request_id

    def _new_request(self, prompt, params, request_id: str, cache_salt,
                     num_resumed_output_tokens: int = 0) -> list[Request]:
        params = params or SamplingParams()
        if request_id in self._children:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        token_ids = self.tokenize(prompt)
        validate_prompt_tokens(token_ids, self.model_config.vocab_size, self.max_model_len)
        params.validate(self.model_config.vocab_size)
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop", "stop strings need a tokenizer")
        token_ids, resumed = split_resumed(token_ids, num_resumed_output_tokens, params)
        layout = self.executor.kv_cache_layout
        max_out = max_output_tokens(len(token_ids), params, self.max_model_len, layout.num_blocks, layout.block_size)
        children = self._make_children(request_id, token_ids, params, max_out, cache_salt)
        self.guided.admit(children)
        if resumed:
            resume_request(children[0], resumed)
        self._children[request_id] = children
        self.output_processor.add_group(request_id, children)
        return children

    # ---- disaggregation: prefill ships KV, decode receives it ------------------------------

    def reserve_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                        cache_salt: str | None = None, num_resumed_output_tokens: int = 0) -> Reservation:
        """Decode role: reserve blocks for a prompt whose KV a prefill instance will send (its
        last `num_resumed_output_tokens` generated elsewhere already: see add_request).
        Raises CapacityError when there is no room (the caller tries another instance)."""
        if params.n != 1:
            raise InvalidRequestError("n", "disaggregated requests generate one completion each")
        [request] = self._new_request(list(prompt_token_ids), params, request_id, cache_salt,
                                      num_resumed_output_tokens)
        if not self.scheduler.reserve(request):
            self._forget(request_id)
            raise CapacityError(f"no room for {request.num_prompt_tokens} prompt tokens")
        return Reservation(self.kv_manager.block_ids(request_id), request.num_cached_prompt_tokens)

    def activate_request(self, request_id: str, first_token_id: int,
                         first_logprobs: SampledLogprobs | None = None) -> list[RequestOutput]:
        """Decode role: the prompt's KV is in the reserved blocks; start decoding after the
        prefill instance's first token."""
        if request_id not in self.scheduler.reserved:
            raise InvalidRequestError("request_id", f"{request_id!r} has no reservation")
        request = self.scheduler.activate(request_id, first_token_id)
        self._finish_guided([request])
        logprobs = {request_id: first_logprobs} if first_logprobs is not None else {}
        return self._process_outputs([request], ModelRunnerOutput(logprobs=logprobs))

    def held_block_ids(self, request_id: str) -> list[int]:
        """Prefill role: the blocks holding a finished request's prompt KV."""
        if request_id not in self.scheduler.held:
            raise InvalidRequestError("request_id", f"{request_id!r} holds no blocks")
        return self.kv_manager.block_ids(request_id)

    def release_request(self, request_id: str) -> None:
        """Prefill role: the KV has been shipped (or given up on); free the blocks."""
        self.scheduler.release_held(request_id)

    def _forget(self, request_id: str) -> None:
        self._children.pop(request_id, None)
        self.output_processor.abort_group(request_id)

    def _make_children(self, request_id, token_ids, params, max_out, cache_salt) -> list[Request]:
        children = []
        for index in range(params.n):
            child_params = params
            if index > 0 and params.seed is not None:
                child_params = replace(params, seed=params.seed + index)
            children.append(Request(
                request_id if params.n == 1 else f"{request_id}#{index}", token_ids, child_params,
                eos_token_ids=tuple(self.model_config.eos_token_ids), max_output_tokens=max_out,
                cache_salt=cache_salt, prompt_parent=children[0] if children else None))
        return children

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its blocks at once; returns its final output, if it was live."""
        children = self._children.pop(request_id, None)
        if children is None:
            return None
        self.scheduler.abort([child.request_id for child in children])
        return self.output_processor.abort_group(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._children)

    def requests_of(self, request_id: str) -> list[Request]:
        """The engine requests (one per completion of n) behind a request id; [] once it ended."""
        return list(self._children.get(request_id, ()))

    # ---- one step ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One engine step. A request whose own computation fails (guided mask, sampling,
        logprobs, speculation, output processing) finishes alone with finish reason "error";
        only a failure of the step as a whole (the forward pass) raises."""
        if self.executor.max_concurrent_batches > 1:
            return self._step_with_batches_in_flight()
        scheduler_output, failed = self._schedule()
        return self._apply(scheduler_output, failed, self.executor.execute_model(scheduler_output))

    def _schedule(self) -> tuple[SchedulerOutput, dict[str, str]]:
        """The next batch, and the requests whose guided masks failed (by id, with the error)."""
        scheduler_output = self.scheduler.schedule()
        self.stats.record_schedule(scheduler_output, self.scheduler, self.block_pool)
        failed = self.guided.prepare_step(scheduler_output.scheduled, self.scheduler.requests)
        return scheduler_output, failed

    def _step_with_batches_in_flight(self) -> list[RequestOutput]:
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
               runner_output: ModelRunnerOutput) -> list[RequestOutput]:
        failed_requests = self._fail_requests({**failed, **runner_output.failed})
        updated = self.scheduler.update_from_output(scheduler_output, runner_output.sampled_token_ids,
                                                    runner_output.verified)
        for verified in runner_output.verified.values():
            self.spec_stats.record(verified.num_draft_tokens, verified.num_accepted)
        self._finish_guided(updated)
        return self._process_outputs(failed_requests + updated, runner_output)

    def _fail_requests(self, errors: dict[str, str]) -> list[Request]:
        """Finish each still-live request in `errors` (request id -> message) with an error."""
        failed = []
        for request_id, message in errors.items():
            request = self.scheduler.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            logger.warning("request %s failed: %s", request_id, message)
            request.error = message
            self.scheduler.finish(request, RequestStatus.FINISHED_ERROR)
            failed.append(request)
        return failed

    def _finish_guided(self, updated: list[Request]) -> None:
        """Advance guided requests' matchers with their new tokens; end those that are done."""
        for request, status in self.guided.advance(updated):
            self.scheduler.finish(request, status)

    def _process_outputs(self, updated: list[Request], runner_output: ModelRunnerOutput) -> list[RequestOutput]:
        outputs, stopped, failed = self.output_processor.process(updated, runner_output)
        for request in stopped:
            self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED)
        for request in failed:
            self.scheduler.finish(request, RequestStatus.FINISHED_ERROR)
        self.stats.record_tokens(sum(len(completion.delta_token_ids)
                                     for output in outputs for completion in output.outputs))
        for output in outputs:
            if output.finished:
                self._children.pop(output.request_id, None)
                self.stats.record_finished(output.num_cached_tokens)
        return outputs
