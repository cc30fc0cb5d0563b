"""Instances dying (SIGKILL: no deregistration, no goodbye) with real processes: Redis, a
gateway, 2 prefill and 2 decode instances with short heartbeat TTLs (the disaggregated stack
of tests/e2e/conftest.py, whose fixture replaces what a test killed before the next one).

Proves: a request whose prefill instance is killed mid-prompt is retried on the other one
and completes with the same tokens as the offline engine; a killed instance stops
heartbeating and drops out of routing and the prefix index, and requests keep succeeding,
also right after a decode instance dies. Live instances end every test with no blocks held.
"""

import threading

import grpc
import pytest

from shared.engine import SamplingParams
from tests.e2e.shared_stacks import HEARTBEAT_TTL_S
from tests.helpers.gateway_client import FINISHED, generate, generate_request, random_token_ids

LONG_PROMPT_TOKENS = 1200


@pytest.fixture
def stack(disaggregated_stack):
    return disaggregated_stack


@pytest.fixture
def reference(chunked_reference):
    """Offline engine computing prompts in the same chunks as the prefill instances."""
    return chunked_reference


def prompt_counters(stack) -> dict[str, int]:
    return {name: status.num_prompt_tokens_computed for name, status in stack.statuses("prefill").items()}


def prompt_tokens_served(stack) -> dict[str, int]:
    """Prompt tokens each prefill instance computed or took from a cache (its pool, its host's
    KV tiers, a peer), over finished requests."""
    return {name: status.num_prompt_tokens_computed + status.num_cached_prompt_tokens
            for name, status in stack.statuses("prefill").items()}


def moved(stack, before: dict[str, int]) -> str | None:
    now = prompt_counters(stack)
    return next((name for name in now if now[name] > before.get(name, 0)), None)


def test_prefill_killed_mid_request_is_retried_on_another_and_completes(stack, reference):
    prompt = random_token_ids(LONG_PROMPT_TOKENS, seed=21)
    expected = reference.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0))[0]
    before = prompt_counters(stack)
    result = {}

    def run():
        try:
            result["completion"] = generate(stack.gateway, generate_request(token_ids=prompt, max_tokens=8),
                                            timeout_s=180)
        except grpc.RpcError as error:
            result["error"] = error

    client = threading.Thread(target=run)
    client.start()
    victim = stack.wait_for(lambda: moved(stack, before), 60.0, "a prefill instance to start", 0.05)
    assert prompt_counters(stack)[victim] - before[victim] < LONG_PROMPT_TOKENS, "killed too late"
    stack.kill(stack.instance(victim))
    client.join(timeout=180)
    assert "error" not in result, (result["error"].code(), result["error"].details())
    completion = result["completion"]
    assert completion.token_ids == expected.token_ids
    survivor = moved(stack, {n: v for n, v in before.items() if n != victim})
    assert survivor is not None and survivor != victim
    assert prompt_counters(stack)[survivor] - before[survivor] == LONG_PROMPT_TOKENS


def test_killed_prefill_drops_out_of_routing_and_the_prefix_index(stack):
    prompt = random_token_ids(160, seed=22)
    before = prompt_counters(stack)
    generate(stack.gateway, generate_request(token_ids=prompt, max_tokens=2))
    holder = moved(stack, before)
    stack.wait_for(lambda: stack.prefix_holders(prompt, {holder})[holder] == 10, 10.0,
                   f"the prefix index to show {holder} holding the prompt")

    stack.kill(stack.instance(holder))
    stack.wait_for(lambda: holder not in stack.registered_ids(), 3 * HEARTBEAT_TTL_S + 5,
                   f"{holder}'s registration to lapse")
    before = prompt_tokens_served(stack)
    completion = generate(stack.gateway, generate_request(token_ids=prompt, max_tokens=2))
    assert completion.finish_reason in FINISHED
    [survivor] = prompt_counters(stack)
    # The survivor serves the whole prompt: computed, or loaded from the host KV tier that the
    # dead holder wrote its blocks to (they outlive it).
    assert prompt_tokens_served(stack)[survivor] - before[survivor] == len(prompt)
    stack.wait_for(lambda: holder not in stack.indexed_ids(), 10.0,
                   f"{holder}'s prefix-index entry to be dropped")


@pytest.mark.live_instances(prefill=1)  # a prefill instance killed by the tests above may stay dead
def test_requests_keep_succeeding_when_a_decode_instance_dies(stack):
    victim, survivor = stack.instances("decode")[:2]
    stack.kill(victim)
    for index in range(3):  # right away: its registration is still live
        completion = generate(stack.gateway, generate_request(text=f"Fact {index}: the moon", max_tokens=3))
        assert completion.finish_reason in FINISHED
    stack.wait_for(lambda: victim.name not in stack.registered_ids(), 3 * HEARTBEAT_TTL_S + 5,
                   f"{victim.name}'s registration to lapse")
    before = stack.status(survivor).num_requests_finished
    generate(stack.gateway, generate_request(text="After the drop-out,", max_tokens=3))
    assert stack.status(survivor).num_requests_finished == before + 1
