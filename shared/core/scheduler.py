"""Continuous batching: which requests compute which tokens in the next step.

One model for every kind of work: each request's computed-token count catches up with its
token count. A step first gives one token to every running decode (low inter-token latency),
then continues partially computed prompts, then admits waiting requests, all within the
step's token budget. Long prompts are chunked across steps; when the cache runs out the
newest request is preempted and later recomputed. With LoRA, a waiting request joins the
running ones only while they use at most `max_loras` distinct adapters with it (else it waits,
first in line, until an adapter's requests finish), so every step fits the adapter slots.

Fair prefill: when several prompts compete for what the decodes left of the budget (prompts
part-way through, plus the waiting requests that have a sequence slot), each prompt takes at
most an equal share of it (never under one block); part-way prompts go least computed first
and leave a share for each waiting request. A short prompt arriving behind a max-length one,
or behind dozens of part-way prompts, is then computed in the next step.

Speculative decoding (`num_spec_tokens` > 0): a running decode that may speculate
(`shared.core.speculation_support`) gets slots for its last token plus up to k proposed tokens,
never more than its remaining max_tokens / model length allow nor than the step's budget;
when the cache has no room for them it decodes one token instead. Afterwards only confirmed
positions count as computed, so rejected slots are overwritten later and never hashed into
the prefix cache; slots allocated for proposals stay with the request for its next steps.

Disaggregation goes through the KV connector (shared.kv_transfer), never through roles here:
a request admitted with remote KV waits, blocks allocated, while the connector receives its
prompt's KV, then starts decoding from the token the producer sampled (or computes its prompt
here after all, `compute_reserved`, like any prompt part-way); a finished request
whose KV the connector is sending keeps its blocks until the connector says it is done. The
scheduler is the one owner of such a reservation (shared.core.remote_kv draws its life): its
arrival and failed transfers as the connector reports them, its deadline (renewable; on the
scheduler's `clock`) and its end: started, computed here, timed out or released.
"""

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from shared.core.kv_cache_manager import KVCacheManager
from shared.core.remote_kv import RemoteKV, RemoteKVEvent, RemoteKVState, deadline_after
from shared.core.request import Request, RequestStatus
from shared.core.scheduler_config import SchedulerConfig
from shared.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared.core.speculation_support import supports_speculation
from shared.core.stop_checks import token_stop_status
from shared.core.verified_tokens import VerifiedTokens
from shared.errors import InvalidRequestError
from shared.kv_cache.blocks import blocks_for_tokens
from shared.kv_transfer.base import KVConnector

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_manager: KVCacheManager, max_model_len: int,
                 num_spec_tokens: int = 0, connector: KVConnector | None = None, max_loras: int | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        # The clock of reservations' deadlines (shared.core.remote_kv).
        self.clock = clock
        # Most distinct LoRA adapters among the running requests (so in any step); None: no limit.
        self.max_loras = max_loras
        # Most proposed tokens per speculating request and step (0: speculation off).
        self.num_spec_tokens = num_spec_tokens
        self.kv = kv_manager
        self.max_model_len = max_model_len
        # Moves KV to and from other engines (disaggregation); None: this engine works alone.
        self.connector = connector
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: set[str] = set()
        # Requests whose prompt KV arrives through the connector into their allocated blocks.
        self.waiting_for_remote_kv: dict[str, Request] = {}
        # Finished requests whose blocks the connector is still sending; freed once sent.
        self.sending: dict[str, Request] = {}
        # Requests in a batch still being computed (pipeline parallelism keeps two batches in
        # flight): not scheduled again nor preempted until their results are applied.
        self.in_flight: set[str] = set()
        self.num_preemptions = 0

    # ---- requests in and out -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """End a request (stop, length, abort or error) and free its blocks, unless the
        connector keeps them until it has sent them (`finish_sending` frees them then)."""
        if request.is_finished:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.WAITING_FOR_REMOTE_KV:
            del self.waiting_for_remote_kv[request.request_id]
            if request.remote_kv.state.is_waiting:  # aborted: the reservation is released
                request.remote_kv.apply(RemoteKVEvent.RELEASE)
        else:
            self.waiting.remove(request)
        request.status = status
        if self._delays_free(request):
            self.sending[request.request_id] = request
        else:
            if self.connector is not None:
                self.connector.cancel(request.request_id)  # before its blocks can be reused
            self.kv.free(request)
        del self.requests[request.request_id]
        self._finished_ids.add(request.request_id)

    def _delays_free(self, request: Request) -> bool:
        if self.connector is None or request.status in (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR):
            return False
        send = request.kv_send
        if send is not None:  # the KV goes out labelled with the adapter it was computed with
            send = replace(send, adapter_key=request.adapter_key or "")
        return self.connector.request_finished(request.request_id, self.kv.block_ids(request.request_id), send)

    def finish_sending(self, request_id: str) -> None:
        """The connector is done with a finished request's blocks (sent or failed): free them."""
        request = self.sending.pop(request_id, None)
        if request is not None:
            self.kv.free(request)

    # ---- requests whose prompt KV arrives through the connector ---------------------------

    def can_admit_remote(self) -> bool:
        return len(self.running) + len(self.waiting_for_remote_kv) < self.config.max_num_seqs

    def admit_with_remote_kv(self, request: Request, transfer_token: bytes, ttl_s: float | None = None) -> bool:
        """Reserve: allocate the prompt's blocks (reusing local prefix-cache hits) and have the
        connector receive the rest into them, until `ttl_s` from now (None: no deadline, the
        caller always releases). False, with nothing changed, when there is no room."""
        if self.connector is None or not self.connector.role.is_consumer:
            raise InvalidRequestError("kv_transfer", "this engine's KV connector does not receive KV")
        if not self.can_admit_remote() or not self._adapter_fits(request):
            return False
        prefix_blocks = self.kv.find_cached_prefix(request)
        num_local = len(prefix_blocks) * self.kv.block_size
        num_external = self.connector.get_num_new_matched_tokens(request.request_id, request.num_tokens, num_local)
        if not self.kv.allocate(request, num_external, prefix_blocks):
            return False
        try:
            self.connector.update_state_after_alloc(request.request_id, self.kv.block_ids(request.request_id),
                                                    num_external, transfer_token, request.adapter_key or "")
        except BaseException:
            self.kv.free(request)
            raise
        request.num_cached_prompt_tokens = num_local
        request.status = RequestStatus.WAITING_FOR_REMOTE_KV
        request.remote_kv = RemoteKV(deadline_after(self.clock(), ttl_s))
        self.requests[request.request_id] = request
        self.waiting_for_remote_kv[request.request_id] = request
        return True

    def on_remote_kv_transfer(self, request_id: str, error: str | None) -> Request | None:
        """The connector reports a transfer into a reservation ended: ARRIVED, or after a
        failure AWAITING_KV again (an earlier arrival undone). None if the reservation ended
        meanwhile (its outcome no longer matters)."""
        request = self.waiting_for_remote_kv.get(request_id)
        if request is None:
            return None
        request.remote_kv.apply(RemoteKVEvent.TRANSFER_OK if error is None else RemoteKVEvent.TRANSFER_FAILED)
        return request

    def renew_remote_kv(self, request_id: str, ttl_s: float) -> bool:
        """Move a reservation's deadline to `ttl_s` from now; False if it has ended."""
        request = self.waiting_for_remote_kv.get(request_id)
        if request is None:
            return False
        request.remote_kv.apply(RemoteKVEvent.RENEW)
        request.remote_kv.deadline = deadline_after(self.clock(), ttl_s)
        return True

    def expire_remote_kv(self) -> list[Request]:
        """Time out every reservation whose deadline has passed: its blocks are freed."""
        now = self.clock()
        expired = [request for request in self.waiting_for_remote_kv.values() if request.remote_kv.is_due(now)]
        for request in expired:
            request.remote_kv.apply(RemoteKVEvent.TIME_OUT)
            self.finish(request, RequestStatus.FINISHED_ABORTED)
        return expired

    def seconds_to_next_deadline(self) -> float:
        """How long until the next reservation is due (math.inf: none has a deadline)."""
        deadlines = [request.remote_kv.deadline for request in self.waiting_for_remote_kv.values()]
        return max(0.0, min(deadlines) - self.clock()) if deadlines else math.inf

    def start_after_remote_kv(self, request_id: str, first_token_id: int) -> Request:
        """The prompt's KV has arrived: the request joins the running decodes with the first
        token that the producer sampled; the connector stops receiving for it."""
        request = self._reserved(request_id)
        if request.remote_kv.state != RemoteKVState.ARRIVED:
            raise InvalidRequestError("request_id", f"the KV of {request_id!r} has not arrived "
                                                    f"({request.remote_kv.num_failed_transfers} failed transfers)")
        request.remote_kv.apply(RemoteKVEvent.START)
        del self.waiting_for_remote_kv[request_id]
        self.connector.cancel(request_id)
        request.num_computed_tokens = request.num_tokens
        self.kv.cache_computed_blocks(request)
        request.append_output_token(first_token_id)
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        status = token_stop_status(request, self.max_model_len)
        if status is not None:
            self.finish(request, status)
        return request

    def compute_reserved(self, request_id: str) -> Request:
        """A request admitted with remote KV computes its prompt here instead (conditional
        disaggregation): the connector stops receiving for it, and it joins the running
        requests as a prompt part-way, from its local prefix-cache hits on, in the blocks it
        holds; steps give it what the running decodes leave of their budget, chunked."""
        request = self._reserved(request_id)
        request.remote_kv.apply(RemoteKVEvent.COMPUTE_LOCALLY)
        del self.waiting_for_remote_kv[request_id]
        self.connector.cancel(request_id)
        request.num_computed_tokens = request.num_cached_prompt_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        return request

    def release_remote_kv(self, request_id: str, keep_arrived: bool = False) -> bool:
        """Release a reservation: its blocks are freed; with `keep_arrived` (a peer pull), KV
        that arrived joins the prefix cache first. False if it had ended."""
        request = self.waiting_for_remote_kv.get(request_id)
        if request is None:
            return False
        if keep_arrived and request.remote_kv.state == RemoteKVState.ARRIVED:
            request.num_computed_tokens = request.num_tokens
            self.kv.cache_computed_blocks(request)
        self.finish(request, RequestStatus.FINISHED_ABORTED)
        return True

    def _reserved(self, request_id: str) -> Request:
        request = self.waiting_for_remote_kv.get(request_id)
        if request is None:
            raise InvalidRequestError("request_id", f"{request_id!r} has no reservation")
        return request

    def abort(self, request_ids: list[str]) -> None:
        """Finish each request as aborted; a send in flight is abandoned (its blocks are freed
        when the connector reports it ended)."""
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self.finish(request, RequestStatus.FINISHED_ABORTED)
            elif request_id in self.sending:
                self.connector.cancel(request_id)

    @property
    def num_unfinished(self) -> int:
        """Requests that steps will advance (those waiting for remote KV are not among them)."""
        return len(self.waiting) + len(self.running)

    # ---- one step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput(finished_request_ids=self._finished_ids)
        self._finished_ids = set()
        budget, share = self._schedule_running(output, self.config.max_num_batched_tokens)
        if not output.preempted_request_ids:
            self._schedule_waiting(output, budget, share)
        output.scheduled.sort(key=lambda item: not item.is_decode)
        return output

    def _schedule_running(self, output: SchedulerOutput, budget: int) -> tuple[int, int]:
        """Schedule the running requests, decodes first; returns the budget left and the
        per-prompt share of it. Under fair prefill, part-way prompts leave room for a short
        waiting prompt, so it starts even behind as many long prompts as may share a step."""
        scheduled: set[str] = set()
        share, held_back = None, 0
        for request in sorted(self.running, key=_running_order):
            if budget <= 0:
                break
            if request.status != RequestStatus.RUNNING or request.request_id in self.in_flight:
                continue  # preempted earlier in this loop, or still computing
            is_prompt = request.num_tokens_to_compute > 1
            if share is None and is_prompt:
                share = self._prompt_share(budget)
                held_back = self._room_for_a_short_prompt(share) if share < budget else 0
            limit = min(budget - held_back, share) if is_prompt else budget
            if limit <= 0:
                continue
            num_new = self._chunk_size(request, limit)
            num_spec = self._num_spec_tokens(request, budget)
            num_waiting_decodes = len(self.running) - len(scheduled) - 1
            if num_spec and not self._allocate_with_proposals(request, num_new + num_spec, num_waiting_decodes):
                num_spec = 0
            if not num_spec and not self._allocate_or_preempt(request, num_new, scheduled, output):
                continue
            output.scheduled.append(self._make_scheduled(request, num_new, num_spec))
            scheduled.add(request.request_id)
            budget -= num_new + num_spec
        return budget, share if share is not None else self._prompt_share(budget)

    def _prompt_share(self, budget: int) -> int:
        """The most prompt tokens one request may compute this step, `budget` being what the
        decodes left: an equal share among the first max_num_partial_prefills prompts that
        compete for it (chunked prefill)."""
        if not (self.config.enable_chunked_prefill and self.config.fair_prefill):
            return budget
        num_partial = sum(1 for r in self.running if r.num_tokens_to_compute > 1)
        num_prompts = min(num_partial + self._num_admissible(), self.config.max_num_partial_prefills)
        if num_prompts <= 1:
            return budget
        return max(self.kv.block_size, -(-budget // num_prompts))

    def _room_for_a_short_prompt(self, share: int) -> int:
        """Tokens the part-way prompts leave for the next waiting prompt with a slot when it
        fits in one share: a short prompt never waits behind long ones (a long one waits for
        a part-way prompt to finish, so no more than max_num_partial_prefills share a step)."""
        if not self._num_admissible():
            return 0
        num_needed = self.waiting[0].num_tokens_to_compute
        return num_needed if num_needed <= share else 0

    def _num_admissible(self) -> int:
        """Waiting requests that have a sequence slot this step."""
        return min(len(self.waiting), max(0, self.config.max_num_seqs - len(self.running)))

    def _allocate_with_proposals(self, request: Request, num_tokens: int, num_waiting_decodes: int) -> bool:
        """Allocate slots for the last token and the proposals, unless that would leave fewer
        free blocks than running requests still to schedule: proposals never cause a preemption."""
        num_needed = blocks_for_tokens(request.num_computed_tokens + num_tokens, self.kv.block_size)
        num_new_blocks = max(0, num_needed - self.kv.num_blocks_held(request.request_id))
        if self.kv.pool.num_free_blocks - num_new_blocks < num_waiting_decodes:
            return False
        return self.kv.allocate(request, num_tokens)

    def _num_spec_tokens(self, request: Request, budget: int) -> int:
        """Proposal slots for a running decode: k, capped so that accepting every proposal
        plus the bonus token stays within max_tokens, the model length and the budget."""
        if (self.num_spec_tokens == 0 or request.num_tokens_to_compute != 1
                or request.num_output_tokens == 0 or not supports_speculation(request)):
            return 0
        num_left = min(request.max_output_tokens - request.num_output_tokens,
                       self.max_model_len - request.num_tokens)
        return max(0, min(self.num_spec_tokens, num_left - 1, budget - 1))

    def _allocate_or_preempt(self, request: Request, num_new: int, scheduled: set[str],
                             output: SchedulerOutput) -> bool:
        """Allocate, preempting the newest not-yet-scheduled request until it fits.
        False when `request` itself was the newest and got preempted."""
        while not self.kv.allocate(request, num_new):
            candidates = [r for r in self.running if r.request_id not in scheduled | self.in_flight]
            if not candidates:
                return False  # only requests still computing hold blocks: wait for them
            victim = max(candidates, key=lambda r: r.arrival_time)
            self._preempt(victim)
            output.preempted_request_ids.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_draft_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        logger.debug("preempted %s", request.request_id, extra={"request_id": request.request_id})

    def _schedule_waiting(self, output: SchedulerOutput, budget: int, share: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if self._waits_for_parent(request) or not self._adapter_fits(request):
                break
            prefix_blocks = self._reusable_prefix(request)
            num_reused = len(prefix_blocks) * self.kv.block_size
            num_new = self._chunk_size(request, min(budget, share), num_reused)
            if num_new < request.num_tokens_to_compute - num_reused and not self.config.enable_chunked_prefill:
                break
            if not self.kv.allocate(request, num_new, prefix_blocks):
                break
            self.waiting.popleft()
            request.num_computed_tokens += num_reused
            if request.num_preemptions == 0:
                request.num_cached_prompt_tokens = num_reused
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            output.scheduled.append(self._make_scheduled(request, num_new))
            budget -= num_new

    def _adapter_fits(self, request: Request) -> bool:
        """A request may join the running ones if its LoRA adapter is among theirs, or they use
        fewer than max_loras adapters: every step then fits the model runner's adapter slots."""
        if self.max_loras is None or request.lora_request is None:
            return True
        active = {r.lora_request.lora_int_id for r in (*self.running, *self.waiting_for_remote_kv.values())
                  if r.lora_request is not None}
        return request.lora_request.lora_int_id in active or len(active) < self.max_loras

    def _waits_for_parent(self, request: Request) -> bool:
        parent = request.prompt_parent
        if parent is None or parent.is_finished or request.num_computed_tokens > 0:
            return False
        return parent.num_computed_tokens < parent.num_prompt_tokens

    def _reusable_prefix(self, request: Request):
        if request.num_computed_tokens > 0:
            return []
        parent = request.prompt_parent
        if parent is not None and parent.status == RequestStatus.RUNNING:
            return self.kv.shared_prompt_blocks(parent, request)
        return self.kv.find_cached_prefix(request)

    def _chunk_size(self, request: Request, budget: int, num_reused: int = 0) -> int:
        num_new = min(request.num_tokens_to_compute - num_reused, budget)
        if self.config.long_prefill_token_threshold > 0:
            num_new = min(num_new, self.config.long_prefill_token_threshold)
        return num_new

    def _make_scheduled(self, request: Request, num_new: int, num_spec: int = 0) -> ScheduledRequest:
        start = request.num_computed_tokens
        end = start + num_new
        params = request.sampling_params
        targets = None
        if params.prompt_logprobs is not None and start + 1 < request.num_prompt_tokens:
            targets = request.prompt_token_ids[start + 1 : min(end + 1, request.num_prompt_tokens)]
        return ScheduledRequest(
            request_id=request.request_id,
            token_ids=request.all_token_ids[start:end],
            start_position=start,
            block_ids=self.kv.block_ids(request.request_id),
            sampling_params=params if end == request.num_tokens else None,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=request.output_token_ids,
            stop_and_eos_token_ids=self._suppressed_ids(request),
            prompt_logprob_targets=targets,
            num_prompt_logprobs=params.prompt_logprobs or 0,
            num_spec_tokens=num_spec,
            num_draft_computed_tokens=request.num_draft_computed_tokens,
            lora_request=request.lora_request,
        )

    def _suppressed_ids(self, request: Request) -> tuple[int, ...]:
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            return ()
        eos = () if params.ignore_eos else request.eos_token_ids
        return tuple(eos) + tuple(params.stop_token_ids)

    # ---- results -------------------------------------------------------------------------

    def update_from_output(self, output: SchedulerOutput, sampled_token_ids: dict[str, int],
                           verified: dict[str, VerifiedTokens] | None = None) -> list[Request]:
        """Advance each scheduled request; append sampled tokens (`verified`: a speculating
        request's tokens) and finish on token-level stops. Returns the requests that received
        at least one token this step."""
        updated = []
        for item in output.scheduled:
            request = self.requests.get(item.request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # aborted or preempted after scheduling
            if verified and item.request_id in verified:
                self._append_verified(request, verified[item.request_id])
                updated.append(request)
                continue
            request.num_computed_tokens += item.num_tokens
            self.kv.cache_computed_blocks(request)
            if item.sampling_params is None:
                continue
            request.append_output_token(sampled_token_ids[item.request_id])
            updated.append(request)
            status = token_stop_status(request, self.max_model_len)
            if status is not None:
                self.finish(request, status)
        return updated

    def _append_verified(self, request: Request, result: VerifiedTokens) -> None:
        """Append accepted and bonus tokens up to the first token-level stop (the rest are
        dropped); the verified positions before the newest token become computed."""
        status = None
        for token_id in result.token_ids:
            request.append_output_token(token_id)
            status = token_stop_status(request, self.max_model_len)
            if status is not None:
                break
        request.num_computed_tokens = request.num_tokens - 1
        request.num_draft_computed_tokens = min(result.num_draft_computed_tokens, request.num_computed_tokens)
        self.kv.cache_computed_blocks(request)
        if status is not None:
            self.finish(request, status)


def _running_order(request: Request) -> tuple[bool, float]:
    """Decodes first (in running order), then part-way prompts, first come first: the oldest
    prompt's first token comes out first."""
    is_prompt = request.num_tokens_to_compute > 1
    return is_prompt, request.arrival_time if is_prompt else 0.0
