"""One trace per request across real processes: a gateway, one prefill and two decode
instances (each with its engine-core process) started as `pdserve up` starts them, with
`--otlp-traces-endpoint` pointing at an OTLP/gRPC receiver in this test process.

A request that arrives with a W3C `traceparent` yields one trace under that parent whose
spans come from all three services and both engine cores, every parent link inside the
trace, the phases in causal order and adding up to the time to first token the client
measured; the trace id comes back as trailing metadata and is on the services' log lines.
A request whose decode instance dies mid-stream shows both decode instances in its trace.
"""

import json
import secrets
import signal
import time
import urllib.request

import pytest

from services.launcher import LocalStack
from tests.helpers.gateway_client import generate_request, random_token_ids
from tests.helpers.otlp_collector import CollectedSpan, OtlpCollector
from tests.helpers.stack import StackHarness, make_stack_config

INSTANCE = "pdserve.v1.Instance/"
# The gateway's phases before the first token reaches the client, in order.
GATEWAY_PHASES = ("gateway.tokenize", "gateway.route", "gateway.reserve", "gateway.prefill")


@pytest.fixture(scope="module")
def collector():
    with OtlpCollector() as running:
        yield running


@pytest.fixture(scope="module")
def stack(smollm2_folder, tmp_path_factory, collector):
    config = make_stack_config(smollm2_folder, "bfloat16", num_prefill=1, num_decode=2,
                               run_dir=tmp_path_factory.mktemp("tracing"), otlp_traces_endpoint=collector.endpoint,
                               extra_args={"instance": ["--num-blocks", "256"],
                                           # the engine core logs each arrival at DEBUG
                                           "prefill": ["--log-level", "DEBUG"]})
    config.env["OTEL_BSP_SCHEDULE_DELAY"] = "100"  # export every 0.1 s, not every 5 s
    local = LocalStack(config)
    local.start()
    try:
        yield StackHarness(local, smollm2_folder)
    finally:
        local.stop()


def new_parent() -> tuple[str, str]:
    """A client's own span: (trace id, traceparent header)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, f"00-{trace_id}-{span_id}-01"


def traced_generate(stack, request, traceparent: str, on_token=None):
    """Stream one request under `traceparent`: (tokens, wall-clock ns sent, ns of the first
    token, the x-trace-id trailer)."""
    sent_ns, first_ns, tokens = time.time_ns(), None, []  # before the call: it starts the RPC at once
    call = stack.gateway.Generate(request, timeout=180, metadata=(("traceparent", traceparent),))
    for message in call:
        if message.token_ids and first_ns is None:
            first_ns = time.time_ns()
        tokens.extend(message.token_ids)
        if on_token is not None:
            on_token(tokens)
    return tokens, sent_ns, first_ns, dict(call.trailing_metadata())["x-trace-id"]


def named(spans: list[CollectedSpan], name: str, role: str | None = None) -> list[CollectedSpan]:
    return [s for s in spans if s.name == name and (role is None or s.resource.get("pdserve.role") == role)]


def one(spans: list[CollectedSpan], name: str, role: str | None = None) -> CollectedSpan:
    found = named(spans, name, role)
    assert len(found) == 1, (name, role, [(s.service_name, s.name) for s in spans])
    return found[0]


def is_whole(spans: list[CollectedSpan]) -> bool:
    """The last spans of each process have arrived (exporters batch, processes differ)."""
    return (bool(named(spans, "gateway.request")) and bool(named(spans, "decode.engine"))
            and bool(named(spans, "engine_core.kv_send", "prefill"))
            and bool(named(spans, "engine_core.request", "prefill")) and bool(named(spans, "engine_core.request", "decode"))
            and bool(named(spans, INSTANCE + "Decode")) and bool(named(spans, "decode.reservation")))


def test_one_request_is_one_trace_across_every_process(stack, collector):
    trace_id, traceparent = new_parent()
    request = generate_request(token_ids=random_token_ids(90, seed=11), max_tokens=6, ignore_eos=True)
    tokens, sent_ns, first_ns, answered_trace_id = traced_generate(stack, request, traceparent)
    assert len(tokens) == 6 and answered_trace_id == trace_id
    spans = collector.wait_for(trace_id, is_whole)

    services = {s.service_name for s in spans}
    assert {"pdserve-gateway", "pdserve-prefill", "pdserve-decode", "pdserve-engine-core"} <= services
    assert {s.resource["pdserve.role"] for s in spans if s.service_name == "pdserve-engine-core"} == {
        "prefill", "decode"}

    # Every parent is in the trace, but the client's span; the gateway's server span is the root.
    by_id = {s.span_id: s for s in spans}
    client_span_id = traceparent.split("-")[2]
    assert all(s.parent_span_id in by_id or s.parent_span_id == client_span_id for s in spans)
    root = one(spans, "pdserve.v1.Gateway/Generate")
    assert root.parent_span_id == client_span_id
    parent = lambda span: by_id[span.parent_span_id]  # noqa: E731
    assert parent(one(spans, "gateway.request")) is root
    assert parent(one(spans, INSTANCE + "StreamPrefill")) is one(spans, "gateway.prefill")
    assert parent(one(spans, INSTANCE + "Decode")) is one(spans, "gateway.decode")
    assert parent(one(spans, INSTANCE + "Reserve")).name == "gateway.reserve"
    prefill_core = one(spans, "engine_core.request", "prefill")
    assert parent(prefill_core) is one(spans, "prefill.engine")
    assert parent(one(spans, "engine_core.request", "decode")).name == INSTANCE + "Reserve"
    chunks = named(spans, "engine_core.prompt_chunk", "prefill")
    assert chunks and all(parent(chunk) is prefill_core for chunk in chunks)
    assert sum(chunk.attributes["pdserve.num_tokens"] for chunk in chunks) == 90
    send = one(spans, "engine_core.kv_send", "prefill")
    assert send.attributes["pdserve.kv_send.outcome"] == "sent" and send.attributes["pdserve.kv_send.bytes"] > 0
    assert "kv_received" in one(spans, "decode.reservation").events
    decode_engine = one(spans, "decode.engine")
    assert decode_engine.attributes["pdserve.finish_reason"] == "length"
    assert decode_engine.attributes["pdserve.num_generated_tokens"] == 6

    # Causal order on one clock (wall-clock ns, every process of this host), then the sum.
    request_span = one(spans, "gateway.request")
    gateway_first_ns = request_span.event_time("first_token")
    assert sent_ns <= root.start_ns <= request_span.start_ns < gateway_first_ns <= first_ns
    assert all(request_span.start_ns <= chunk.start_ns <= chunk.end_ns <= gateway_first_ns for chunk in chunks)
    phases = [one(spans, name) for name in GATEWAY_PHASES]
    assert all(earlier.end_ns <= later.start_ns for earlier, later in zip(phases, phases[1:]))
    prefill_attempt = phases[-1]
    covered_ns = sum(p.end_ns - p.start_ns for p in phases[:-1]) + (
        prefill_attempt.event_time("first_token") - prefill_attempt.start_ns)
    client_ttft_ns = first_ns - sent_ns
    assert covered_ns <= gateway_first_ns - request_span.start_ns <= client_ttft_ns
    # What the phases leave out is the client's own hop and a few statements between them.
    assert client_ttft_ns - covered_ns <= max(0.5 * client_ttft_ns, 500e6), (covered_ns, client_ttft_ns)

    # The trace id is on the log lines of the request in every service and engine core.
    for name in ("gateway", "prefill-0"):
        assert f"trace={trace_id}" in (stack.stack.run_dir / "logs" / f"{name}.log").read_text()
    prefill_log = (stack.stack.run_dir / "logs" / "prefill-0.log").read_text().splitlines()
    assert [line for line in prefill_log if "engine-core[" in line and "arrived" in line and f"trace={trace_id}" in line]


def test_the_http_api_takes_the_traceparent_and_answers_the_trace_id(stack, collector):
    trace_id, traceparent = new_parent()
    http_address = stack.stack.ready_info["gateway"]["http_address"]
    body = json.dumps({"model": stack.model_folder.name, "prompt": "Why is the sky blue?", "max_tokens": 2})
    request = urllib.request.Request(f"http://{http_address}/v1/completions", data=body.encode(), method="POST",
                                     headers={"content-type": "application/json", "traceparent": traceparent})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200 and response.headers["x-trace-id"] == trace_id
    spans = collector.wait_for(trace_id, lambda found: bool(named(found, "gateway.request"))
                               and bool(named(found, "POST /v1/completions")))
    server = one(spans, "POST /v1/completions")
    assert server.parent_span_id == traceparent.split("-")[2]
    assert server.attributes["http.response.status_code"] == 200


def test_a_migrated_request_shows_both_decode_instances(stack, collector):
    trace_id, traceparent = new_parent()
    request = generate_request(token_ids=random_token_ids(60, seed=12), max_tokens=30, ignore_eos=True)
    victims = []

    def kill_the_decoding_instance(tokens):
        if not victims and len(tokens) >= 4:
            [victim] = [i for i in stack.instances("decode") if stack.status(i).num_running]
            victims.append(victim.name)
            stack.kill(victim, signal.SIGKILL)

    tokens, _, _, answered_trace_id = traced_generate(stack, request, traceparent, kill_the_decoding_instance)
    assert len(tokens) == 30 and answered_trace_id == trace_id and victims

    def has_both(spans):
        return len(named(spans, "gateway.attempt")) == 2 and bool(named(spans, "gateway.request"))

    spans = collector.wait_for(trace_id, has_both)
    first, second = sorted(named(spans, "gateway.attempt"), key=lambda s: s.start_ns)
    assert first.attributes["pdserve.decode_instance"] == victims[0]
    assert second.attributes["pdserve.decode_instance"] not in (victims[0], None)
    assert second.attributes["pdserve.num_resumed_tokens"] >= 4
    assert "failure" in first.events and "migration" in first.events
    assert first.events["migration"][0][1]["pdserve.loss_reason"] == "failure"
