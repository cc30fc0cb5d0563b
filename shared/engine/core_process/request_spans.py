"""RequestSpans: each request's life in the engine-core process as spans of the request's
trace (its parent arrives with the request, as W3C headers), made only while tracing is on.

    engine_core.request        arrival -> finish (reason, token counts, speculative acceptance),
                               events: kv_received / kv_receive_failed, first_token
      engine_core.grammar_compile  arrival -> the guided constraint compiled (or failed)
      engine_core.queue_wait       arrival (or the constraint compiled, or a reservation's KV
                                   arrived) -> first scheduled
      engine_core.prompt_chunk     one per step that computes part of the prompt (tokens, start)
      engine_core.kv_send          last prompt chunk computed -> the send ended (bytes, blocks,
                                   seconds, outcome)

Timestamps are wall-clock nanoseconds (time.time_ns), which every process of a host shares.
"""

import time
from dataclasses import dataclass, field

from shared.core.scheduler_output import SchedulerOutput
from shared.engine_api.client import ReservationEventKind
from shared.engine.core_outputs import EngineCoreOutput
from shared.engine_api.outputs import FinishReason
from shared.executor.base import ModelRunnerOutput
from shared.kv_transfer.types import KVSendParams
from shared.logging_setup import remember_trace_id
from shared.tracing import extract_context, record_failure, start_span


@dataclass
class _Tracked:
    span: object
    context: object
    queued_at_ns: int
    kv_send: KVSendParams | None = None
    is_scheduled: bool = False
    has_first_token: bool = False
    send_started_ns: int | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_prompt_chunks: int = 0
    children: set[str] = field(default_factory=set)


class RequestSpans:
    def __init__(self):
        self._tracked: dict[str, _Tracked] = {}
        self._step_started_ns = 0

    def __len__(self) -> int:
        return len(self._tracked)

    # ---- arrival -------------------------------------------------------------------------

    def on_arrival(self, request_id: str, carrier: dict[str, str] | None, kind: str,
                   kv_send: KVSendParams | None = None) -> None:
        """A request (`kind`: generate or reservation) reached the core."""
        now = time.time_ns()
        context = extract_context(carrier)
        request_span = start_span("engine_core.request", parent=context, start_time_ns=now,
                                  attributes={"pdserve.request_id": request_id, "pdserve.kind": kind})
        self._tracked[request_id] = _Tracked(request_span, _child_context(request_span), now, kv_send)
        span_context = request_span.get_span_context()
        if span_context.is_valid:  # this process's log lines naming the request carry its trace id
            remember_trace_id(request_id, format(span_context.trace_id, "032x"))

    def on_compiled(self, request_id: str, error: str | None = None) -> None:
        """A guided request's constraint compiled (or not): the compile span, and the queue wait
        starts now."""
        tracked = self._tracked.get(request_id)
        if tracked is None:
            return
        now = time.time_ns()
        compile_span = start_span("engine_core.grammar_compile", parent=tracked.context,
                                  start_time_ns=tracked.queued_at_ns)
        if error is not None:
            record_failure(compile_span, "INVALID_ARGUMENT", error)
        compile_span.end(end_time=now)
        tracked.span.set_attribute("pdserve.guided.compile_seconds", (now - tracked.queued_at_ns) / 1e9)
        tracked.queued_at_ns = now

    def on_reservation_events(self, events) -> None:
        """A reservation's KV arrived, a transfer into it failed, or it timed out."""
        for event in events:
            tracked = self._tracked.get(event.request_id)
            if tracked is None:
                continue
            if event.kind == ReservationEventKind.EXPIRED:
                self.on_released(event.request_id, "lease_expired")
            elif event.kind == ReservationEventKind.ARRIVED:
                tracked.span.add_event("kv_received")
                tracked.queued_at_ns = time.time_ns()  # a reservation queues once its KV is here
            else:
                tracked.span.add_event("kv_receive_failed", {"pdserve.failure": "kv_transfer",
                                                             "message": (event.error or "")[:300]})

    # ---- steps ---------------------------------------------------------------------------

    def on_step_start(self) -> None:
        self._step_started_ns = time.time_ns()

    def on_step_applied(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> None:
        """Called by the engine once a step's results are in."""
        now = time.time_ns()
        started = self._step_started_ns or now
        for item in scheduler_output.scheduled:
            tracked = self._tracked.get(_group_id(item.request_id))
            if tracked is None:
                continue
            if not tracked.is_scheduled:
                tracked.is_scheduled = True
                start_span("engine_core.queue_wait", parent=tracked.context,
                           start_time_ns=tracked.queued_at_ns).end(end_time=started)
            if item.start_position < len(item.prompt_token_ids):  # part of the prompt
                tracked.num_prompt_chunks += 1
                start_span("engine_core.prompt_chunk", parent=tracked.context, start_time_ns=started,
                           attributes={"pdserve.num_tokens": item.num_tokens,
                                       "pdserve.start_position": item.start_position,
                                       "pdserve.batch_tokens": scheduler_output.num_batched_tokens}
                           ).end(end_time=now)
        for request_id, verified in runner_output.verified.items():
            tracked = self._tracked.get(_group_id(request_id))
            if tracked is not None:
                tracked.num_draft_tokens += verified.num_draft_tokens
                tracked.num_accepted_tokens += verified.num_accepted

    def on_outputs(self, outputs: list[EngineCoreOutput]) -> None:
        now = time.time_ns()
        for output in outputs:
            tracked = self._tracked.get(_group_id(output.request_id))
            if tracked is None:
                continue
            if output.new_token_ids and not tracked.has_first_token:
                tracked.has_first_token = True
                tracked.span.add_event("first_token", timestamp=now)
                if tracked.kv_send is not None:
                    tracked.send_started_ns = now
            if output.finished:
                self._finish(_group_id(output.request_id), tracked, output, now)

    # ---- endings -------------------------------------------------------------------------

    def on_released(self, request_id: str, outcome: str) -> None:
        """A reservation freed without decoding, or an aborted request."""
        tracked = self._tracked.pop(request_id, None)
        if tracked is not None:
            tracked.span.set_attribute("pdserve.finish_reason", outcome)
            tracked.span.end()

    def _finish(self, request_id: str, tracked: _Tracked, output: EngineCoreOutput, now: int) -> None:
        self._tracked.pop(request_id, None)
        if tracked.kv_send is not None:
            self._end_send(tracked, output, now)
        attributes = {"pdserve.finish_reason": output.finish_reason or "none",
                      "pdserve.num_cached_prompt_tokens": output.num_cached_tokens,
                      "pdserve.num_prompt_chunks": tracked.num_prompt_chunks}
        if tracked.num_draft_tokens:
            attributes.update({"pdserve.spec.num_draft_tokens": tracked.num_draft_tokens,
                               "pdserve.spec.num_accepted_tokens": tracked.num_accepted_tokens,
                               "pdserve.spec.acceptance_rate": tracked.num_accepted_tokens / tracked.num_draft_tokens})
        tracked.span.set_attributes(attributes)
        if output.finish_reason == FinishReason.ERROR:
            record_failure(tracked.span, "INTERNAL", output.error or "the request failed in the engine")
        tracked.span.end(end_time=now)

    @staticmethod
    def _end_send(tracked: _Tracked, output: EngineCoreOutput, now: int) -> None:
        send = tracked.kv_send
        send_span = start_span("engine_core.kv_send", parent=tracked.context,
                               start_time_ns=tracked.send_started_ns or now,
                               attributes={"pdserve.kv_send.blocks": len(send.remote_block_ids) - send.num_skip_blocks})
        result = output.kv_transfer
        if result is not None:
            send_span.set_attributes({"pdserve.kv_send.bytes": result.num_bytes,
                                      "pdserve.kv_send.seconds": result.seconds,
                                      "pdserve.kv_send.outcome": "sent"})
        else:
            send_span.set_attribute("pdserve.kv_send.outcome", "failed" if output.kv_transfer_error else "none")
            if output.kv_transfer_error:
                record_failure(send_span, "ABORTED", output.kv_transfer_error, **{"pdserve.failure": "kv_transfer"})
        send_span.end(end_time=now)


def _group_id(engine_request_id: str) -> str:
    """`<id>#<index>` (completion `index` of n > 1) -> `<id>`."""
    return engine_request_id.partition("#")[0]


def _child_context(parent_span):
    from opentelemetry import trace
    return trace.set_span_in_context(parent_span)
