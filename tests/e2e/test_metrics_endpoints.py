"""Prometheus metrics of a real disaggregated stack (separate processes, real UCX): one request
through the gateway moves each service's counters by exactly what that service did. The stack
is shared with other modules, so the test compares scrapes before and after its request."""

import pytest

from tests.helpers.gateway_client import generate, generate_request
from tests.unit.metrics_scrape import labels_of, scrape, value

PROMPT_IDS = list(range(1000, 1037))  # 37 tokens: 2 full blocks + 5
MAX_TOKENS = 5


@pytest.fixture(scope="module")
def stack(served_stack):
    return served_stack


def metrics_address(stack, name: str) -> str:
    return stack.stack.ready_info[name]["metrics_address"]


def count(samples, name: str, **labels: str) -> float:
    """A counter's value; 0 while a labelled counter has no sample yet (nothing counted)."""
    return value(samples, name, **labels) if labels_of(samples, name) else 0.0


def counters(stack) -> dict[str, float]:
    prefill, decode = scrape(metrics_address(stack, "prefill-0")), scrape(metrics_address(stack, "decode-0"))
    gateway = scrape(metrics_address(stack, "gateway"))
    return {
        "sent_bytes": value(prefill, "pdserve:kv_transfer_bytes_total", direction="sent"),
        "received_bytes": value(decode, "pdserve:kv_transfer_bytes_total", direction="received"),
        "sent_transfers": value(prefill, "pdserve:kv_transfer_transfers_total", direction="sent"),
        "prefill_computed": value(prefill, "pdserve:prompt_tokens_computed_total"),
        "prefill_generated": value(prefill, "vllm:generation_tokens_total"),
        "decode_generated": value(decode, "vllm:generation_tokens_total"),
        "decode_ttft_count": value(decode, "vllm:time_to_first_token_seconds_count"),
        "gateway_requests": count(gateway, "pdserve:gateway_requests_total"),
        "gateway_generated": count(gateway, "pdserve:gateway_generation_tokens_total"),
    }


def test_one_request_moves_each_services_counters_by_what_it_did(stack):
    before = counters(stack)
    completion = generate(stack.gateway, generate_request(token_ids=PROMPT_IDS, max_tokens=MAX_TOKENS,
                                                          temperature=0, ignore_eos=True))
    assert len(completion.token_ids) == MAX_TOKENS
    stack.wait_all_blocks_free()
    after = counters(stack)
    delta = {name: after[name] - before[name] for name in before}
    assert delta["sent_bytes"] == delta["received_bytes"] > 0
    assert delta["sent_transfers"] == 1
    assert delta["prefill_computed"] == len(PROMPT_IDS)
    assert delta["prefill_generated"] == 1  # the prefill instance samples the first token
    assert delta["decode_generated"] == MAX_TOKENS
    assert delta["decode_ttft_count"] == 1
    assert delta["gateway_requests"] == 1
    assert delta["gateway_generated"] == MAX_TOKENS
