"""Failure handling end to end with real processes (Redis, gateway, 2 prefill, 2 decode: the
disaggregated stack of tests/e2e/conftest.py, each test undoing what it did):
a request waiting for room on full decode instances, client cancellation and deadlines propagating to prefill and
decode, lease expiry, and a Redis outage and restart. Prefill instances compute prompts in
small chunks (--max-num-batched-tokens), so a cancel arrives while a prompt is half done.
After every test every instance's free-block count is back at its total.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from shared.pb.pdserve.v1 import instance_pb2
from tests.helpers.freeze import Frozen
from tests.unit.metrics_scrape import scrape, value
from tests.helpers.gateway_client import (
    FINISHED, generate, generate_error, generate_request, random_token_ids, release, reserve,
)

LONG_PROMPT_TOKENS = 1200
HOLD_LEASE_MS = 120_000


@pytest.fixture
def stack(disaggregated_stack):
    return disaggregated_stack


def fill(stack, decode, tag: str) -> list[str]:
    """Reserve (directly, long leases) until `decode` refuses even a one-block prompt."""
    stub, held = stack.stub(decode), []
    num_blocks = stack.status(decode).num_free_blocks
    while num_blocks >= 1:
        request_id = f"{tag}-{len(held)}"
        tokens = random_token_ids(num_blocks * 16 - 8, seed=hash(request_id) % 10**9)
        try:
            reserve(stub, request_id, tokens, HOLD_LEASE_MS)
            held.append(request_id)
            num_blocks = stack.status(decode).num_free_blocks
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
            num_blocks //= 2
    return held


def release_all(stack, decode, request_ids: list[str]) -> None:
    for request_id in request_ids:
        assert release(stack.stub(decode), request_id)


def room_waiters(stack) -> float:
    samples = scrape(stack.stack.ready_info["gateway"]["metrics_address"])
    return value(samples, "pdserve:gateway_requests_waiting_decode_room")


def test_a_request_that_no_decode_instance_has_room_for_waits_its_turn_and_is_served_once_room_frees(stack):
    decodes = stack.instances("decode")
    held = {decode.name: fill(stack, decode, f"full-{decode.name}") for decode in decodes}
    try:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(generate, stack.gateway, generate_request(text="Hello there, how are", max_tokens=4))
            stack.wait_for(lambda: room_waiters(stack) == 1, 60, "the request to wait for room")
            assert not waiting.done()
            for decode in decodes:  # room frees: the waiting request is reserved and served
                release_all(stack, decode, held.pop(decode.name))
            assert waiting.result(timeout=120).finish_reason in FINISHED
        assert room_waiters(stack) == 0
    finally:
        for decode in decodes:
            release_all(stack, decode, held.get(decode.name, []))


def test_a_full_decode_instance_refuses_and_another_one_serves(stack):
    decodes = stack.instances("decode")
    held = {decode.name: fill(stack, decode, f"one-{decode.name}") for decode in decodes}
    full, roomy = decodes
    release_all(stack, roomy, held.pop(roomy.name))
    try:
        before = stack.statuses("decode")
        completion = generate(stack.gateway, generate_request(text="The weather today is", max_tokens=4))
        assert completion.finish_reason in FINISHED
        after = stack.statuses("decode")
        assert after[roomy.name].num_requests_finished == before[roomy.name].num_requests_finished + 1
        assert after[full.name].num_requests_finished == before[full.name].num_requests_finished
    finally:
        release_all(stack, full, held[full.name])


def prompt_counters(stack) -> dict[str, int]:
    return {name: status.num_prompt_tokens_computed for name, status in stack.statuses("prefill").items()}


def wait_until_prefilling(stack, counters_before: dict[str, int]) -> str:
    """The prefill instance that has started computing the long prompt (counters moved)."""
    def moving():
        now = prompt_counters(stack)
        return next((name for name in now if now[name] > counters_before[name]), None)
    return stack.wait_for(moving, 30.0, "a prefill instance to start on the prompt", interval_s=0.05)


def assert_prefill_stopped_early(stack, name: str, counters_before: dict[str, int]) -> None:
    """The aborted prompt was not computed to the end (cancellation reached the engine)."""
    stack.wait_all_blocks_free()
    computed = prompt_counters(stack)[name] - counters_before[name]
    assert 0 < computed < LONG_PROMPT_TOKENS, f"{name} computed {computed} of {LONG_PROMPT_TOKENS}"


def test_client_cancel_during_prefill_frees_blocks_on_prefill_and_decode(stack):
    before = prompt_counters(stack)
    prompt = random_token_ids(LONG_PROMPT_TOKENS, seed=11)
    call = stack.gateway.Generate(generate_request(token_ids=prompt, max_tokens=4), timeout=120)
    consumer = threading.Thread(target=lambda: list(_ignore_cancel(call)))
    consumer.start()
    busy = wait_until_prefilling(stack, before)
    assert stack.status(stack.instance(busy)).num_free_blocks < stack.status(stack.instance(busy)).num_total_blocks
    call.cancel()
    consumer.join(timeout=30)
    assert_prefill_stopped_early(stack, busy, before)


def test_deadline_during_prefill_frees_blocks_on_prefill_and_decode(stack):
    """The prefill instance is frozen once it has started the prompt, until the deadline has
    passed: the deadline expires mid-prefill however fast the machine computes."""
    before = prompt_counters(stack)
    prompt = random_token_ids(LONG_PROMPT_TOKENS, seed=12)
    errors = []
    caller = threading.Thread(target=lambda: errors.append(
        generate_error(stack.gateway, generate_request(token_ids=prompt, max_tokens=4), timeout_s=1.5)))
    caller.start()
    busy = wait_until_prefilling(stack, before)
    with Frozen(stack.instance(busy)):
        caller.join(timeout=60)
    assert errors and errors[0].code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert_prefill_stopped_early(stack, busy, before)


def test_client_cancel_during_decode_frees_blocks(stack):
    before = stack.statuses("decode")
    call = stack.gateway.Generate(generate_request(text="Once upon a time", max_tokens=400, ignore_eos=True),
                                  timeout=120)
    num_tokens = 0
    for message in call:
        num_tokens += len(message.token_ids)
        if num_tokens >= 3:
            break
    running = {name: status.num_running for name, status in stack.statuses("decode").items()}
    assert sum(running.values()) == 1, running
    call.cancel()
    stack.wait_all_blocks_free()
    after = stack.statuses("decode")
    generated = sum(after[n].num_generation_tokens - before[n].num_generation_tokens for n in after)
    assert generated < 400
    assert all(status.num_running == 0 for status in after.values())


def test_deadline_during_decode_frees_blocks(stack):
    before = stack.statuses("decode")
    request = generate_request(text="List every prime number:", max_tokens=400, ignore_eos=True)
    received = []
    with pytest.raises(grpc.RpcError) as raised:
        for message in stack.gateway.Generate(request, timeout=4.0):
            received.extend(message.token_ids)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0 < len(received) < 400
    stack.wait_all_blocks_free()
    after = stack.statuses("decode")
    generated = sum(after[n].num_generation_tokens - before[n].num_generation_tokens for n in after)
    assert generated < 400


def test_an_expired_lease_frees_the_reserved_blocks(stack):
    decode = stack.instances("decode")[0]
    stub = stack.stub(decode)
    before = stack.status(decode)
    reply = reserve(stub, "lease-never-decoded", random_token_ids(100, seed=13), lease_ms=800)
    assert len(reply.block_ids) >= 7
    during = stack.status(decode)
    assert during.num_free_blocks <= before.num_free_blocks - len(reply.block_ids)
    assert during.num_reserved == 1
    stack.wait_for(lambda: stack.status(decode).num_free_blocks == before.num_total_blocks, 10.0,
                   "the lease to expire and free the blocks")
    after = stack.status(decode)
    assert after.num_lease_expiries == before.num_lease_expiries + 1
    assert after.num_reserved == 0
    with pytest.raises(grpc.RpcError) as raised:
        list(stub.Decode(instance_pb2.DecodeRequest(request_id="lease-never-decoded", first_token_id=1),
                         timeout=10))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_serving_continues_through_a_redis_outage_and_state_rebuilds(stack):
    names = {instance.name for instance in stack.instances()}
    prompt = random_token_ids(80, seed=14)
    generate(stack.gateway, generate_request(token_ids=prompt, max_tokens=2))
    holders_before = stack.wait_for(
        lambda: {n: b for n, b in stack.prefix_holders(prompt, names).items() if b >= 5},
        10.0, "the prefix index to list the prompt's blocks")

    stack.stop_redis()
    during = generate(stack.gateway, generate_request(text="Redis is down, yet", max_tokens=4))
    assert during.finish_reason in FINISHED

    stack.start_redis()
    stack.wait_for(lambda: stack.registered_ids() == names, 20.0, "every instance to re-register")
    stack.wait_for(lambda: all(stack.prefix_holders(prompt, names)[n] >= 5 for n in holders_before),
                   20.0, "the prefix index to be rebuilt")
    after = generate(stack.gateway, generate_request(text="Redis is back, and", max_tokens=4))
    assert after.finish_reason in FINISHED


def _ignore_cancel(call):
    try:
        yield from call
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.CANCELLED, error.details()
