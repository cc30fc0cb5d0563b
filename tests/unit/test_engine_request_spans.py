"""The engine-core process's spans of a request (shared.engine.core_process.request_spans),
fed the engine's own step and output types: queue wait, one span per prompt chunk, the KV
send with its bytes, blocks and outcome, the first token and the finish, speculative
acceptance as attributes, all children of the caller's span; a released reservation ends its
span; a failed send is a failure event."""

import os

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared.core.verified_tokens import VerifiedTokens
from shared.engine.core_outputs import EngineCoreOutput
from shared.engine_api.client import ReservationEvent, ReservationEventKind
from shared.engine.core_process.request_spans import RequestSpans
from shared.executor.base import ModelRunnerOutput
from shared.kv_transfer.types import KVSendParams, KVTransferResult
from shared.sampling.params import SamplingParams
from shared.tracing import TracingConfig, configure_tracing, inject_context, shutdown_tracing, span
from shared.tracing.runtime import CHILD_TRACING_ENV_VAR

PROMPT = list(range(100, 120))  # 20 tokens: a chunk of 16, then one of 4 that samples
SEND = KVSendParams("127.0.0.1:4000", "r1", (7, 8), 1, b"\x05" * 16)


@pytest.fixture
def exporter():
    memory = InMemorySpanExporter()
    configure_tracing(TracingConfig(), "pdserve-engine-core", exporter=memory)
    yield memory
    shutdown_tracing()
    os.environ.pop(CHILD_TRACING_ENV_VAR, None)


def chunk(request_id: str, start: int, end: int, samples: bool) -> ScheduledRequest:
    return ScheduledRequest(request_id, PROMPT[start:end], start, [0, 1], SamplingParams() if samples else None,
                            PROMPT, [])


def step(spans: RequestSpans, *items: ScheduledRequest, verified=None) -> None:
    spans.on_step_start()
    spans.on_step_applied(SchedulerOutput(scheduled=list(items)), ModelRunnerOutput(verified=verified or {}))


def by_name(exporter) -> dict[str, list]:
    found: dict[str, list] = {}
    for finished in exporter.get_finished_spans():
        found.setdefault(finished.name, []).append(finished)
    return found


def test_a_prefill_request_is_queue_wait_chunks_and_a_kv_send_under_its_callers_span(exporter):
    spans = RequestSpans()
    with span("prefill.engine") as caller:
        carrier = inject_context()
    spans.on_arrival("r1:prefill", carrier, "generate", SEND)
    step(spans, chunk("r1:prefill", 0, 16, samples=False))
    step(spans, chunk("r1:prefill", 16, 20, samples=True))
    spans.on_outputs([EngineCoreOutput("r1:prefill", [42])])
    spans.on_outputs([EngineCoreOutput("r1:prefill", finish_reason="length", num_cached_tokens=0,
                                       kv_transfer=KVTransferResult(4096, 0.01))])
    assert len(spans) == 0
    found = by_name(exporter)
    [request] = found["engine_core.request"]
    assert request.parent.span_id == caller.get_span_context().span_id
    assert request.attributes["pdserve.finish_reason"] == "length"
    assert request.attributes["pdserve.num_prompt_chunks"] == 2
    assert [event.name for event in request.events] == ["first_token"]
    children = [s for name in ("engine_core.queue_wait", "engine_core.prompt_chunk", "engine_core.kv_send")
                for s in found[name]]
    assert all(child.parent.span_id == request.context.span_id for child in children)
    assert [c.attributes["pdserve.num_tokens"] for c in found["engine_core.prompt_chunk"]] == [16, 4]
    assert [c.attributes["pdserve.start_position"] for c in found["engine_core.prompt_chunk"]] == [0, 16]
    [send] = found["engine_core.kv_send"]
    assert (send.attributes["pdserve.kv_send.bytes"], send.attributes["pdserve.kv_send.blocks"],
            send.attributes["pdserve.kv_send.outcome"]) == (4096, 1, "sent")
    [queue] = found["engine_core.queue_wait"]
    assert request.start_time <= queue.start_time <= queue.end_time <= found["engine_core.prompt_chunk"][0].start_time


def test_a_failed_send_is_a_failure_event(exporter):
    spans = RequestSpans()
    spans.on_arrival("r2:prefill", None, "generate", SEND)
    step(spans, chunk("r2:prefill", 0, 20, samples=True))
    spans.on_outputs([EngineCoreOutput("r2:prefill", [42])])
    spans.on_outputs([EngineCoreOutput("r2:prefill", finish_reason="length", kv_transfer_error="peer gone")])
    [send] = by_name(exporter)["engine_core.kv_send"]
    assert send.attributes["pdserve.kv_send.outcome"] == "failed"
    [failure] = [event for event in send.events if event.name == "failure"]
    assert failure.attributes["pdserve.failure"] == "kv_transfer"


def test_a_reservation_notes_its_kv_and_speculation_or_ends_when_released(exporter):
    spans = RequestSpans()
    spans.on_arrival("d1", None, "reservation")
    spans.on_reservation_events([ReservationEvent("d1", ReservationEventKind.ARRIVED)])
    decode = ScheduledRequest("d1", [42], len(PROMPT), [0, 1], SamplingParams(), PROMPT, [42])
    step(spans, decode, verified={"d1": VerifiedTokens([43, 44, 45], num_draft_tokens=3)})
    spans.on_outputs([EngineCoreOutput("d1", [43, 44, 45], finish_reason="stop")])
    spans.on_arrival("d2", None, "reservation")
    spans.on_released("d2", "released")
    found = by_name(exporter)
    first, second = sorted(found["engine_core.request"], key=lambda s: s.attributes["pdserve.request_id"])
    assert "engine_core.prompt_chunk" not in found  # a decode step computes no prompt
    assert [event.name for event in first.events] == ["kv_received", "first_token"]
    assert (first.attributes["pdserve.spec.num_draft_tokens"], first.attributes["pdserve.spec.num_accepted_tokens"]
            ) == (3, 2)
    assert second.attributes["pdserve.finish_reason"] == "released"
