"""A decode pod behind a GAIE gateway (docs/kubernetes.md): a request sent straight to the decode
instance's own OpenAI port, its prefill header naming the prefill instance, is computed there
(its counters move by the prompt, the decode instance's not at all), KV sent over UCX, and the
greedy tokens are the gateway's for the same request. Shares the served stack (bf16: both runs
prefill the whole prompt in one step on the same prefill instance, decode on the same decode
instance, one request at a time, so the computations match; cache salts keep prefix hits out)."""

import json
import urllib.request

import pytest

from tests.unit.metrics_scrape import labels_of, scrape, value

PROMPT = "List three colours of the rainbow, one per line."
MAX_TOKENS = 12
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def stack(served_stack):
    yield served_stack
    served_stack.wait_all_blocks_free()
    served_stack.check_children_alive()


def complete(address: str, salt: str, headers: dict | None = None) -> dict:
    body = {"model": "", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "cache_salt": salt}
    request = urllib.request.Request(f"http://{address}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return json.loads(response.read())


def computed(stack) -> tuple[int, int]:
    """Prompt tokens computed so far by (prefill-0, decode-0)."""
    statuses = stack.statuses()
    return statuses["prefill-0"].num_prompt_tokens_computed, statuses["decode-0"].num_prompt_tokens_computed


def routed(address: str) -> float:
    samples = scrape(address)
    name = "pdserve:named_prefills_total"
    return value(samples, name, outcome="routed") if labels_of(samples, name) else 0.0


def test_the_named_prefill_instance_computes_a_pod_request_as_the_gateway_would(stack):
    pod = stack.stack.ready_info["decode-0"]["openai_address"]
    prefill = stack.stack.ready_info["prefill-0"]["grpc_address"]
    before, routed_before = computed(stack), routed(pod)
    got = complete(pod, "pod", {"x-gateway-prefill-endpoints": prefill})
    after = computed(stack)
    num_prompt_tokens = got["usage"]["prompt_tokens"]
    assert (after[0] - before[0], after[1] - before[1]) == (num_prompt_tokens, 0)
    assert routed(pod) == routed_before + 1
    expected = complete(stack.stack.ready_info["gateway"]["http_address"], "gateway")
    assert got["choices"][0]["text"] == expected["choices"][0]["text"]
    assert got["usage"] == expected["usage"]


def chat_stream(address: str, salt: str, headers: dict | None = None) -> str:
    """The streamed chat completion's text, joined from its SSE chunks."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "stream": True, "cache_salt": salt}
    request = urllib.request.Request(f"http://{address}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        lines = [line.decode().strip() for line in response]
    events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return "".join(json.loads(event)["choices"][0]["delta"].get("content") or ""
                   for event in events[:-1] if json.loads(event)["choices"])


def test_a_streamed_chat_with_llm_ds_header_is_the_gateways(stack):
    pod = stack.stack.ready_info["decode-0"]["openai_address"]
    prefill = stack.stack.ready_info["prefill-0"]["grpc_address"]
    routed_before = routed(pod)
    got = chat_stream(pod, "pod-chat", {"x-prefiller-host-port": prefill})
    assert routed(pod) == routed_before + 1
    assert got and got == chat_stream(stack.stack.ready_info["gateway"]["http_address"], "gateway-chat")
