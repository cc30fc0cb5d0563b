"""Load shedding with real processes, on the shared stack (1 prefill + 1 decode instance).

- Its gateway runs the defaults (admission by predicted wait, --max-queue-wait-s 120, no count
  limit): a burst of 48 streaming chats, three times the old count limit of 16, all complete.
- A second gateway with a tiny --max-queue-wait-s (and a given prompt rate: on a guessed one
  nothing is refused before a first token is measured), the prefill instance's engine core frozen (its
  service still answers health checks and heartbeats, as a busy instance does) so that the first
  request admitted waits however fast the machine is: the rest of a burst are refused with 429,
  each with a Retry-After of its message's predicted wait minus the limit; after the thaw every
  admitted request completes.
- A third gateway with --max-queued-per-instance 1 (the count limit, an option): one request
  waits, the next is refused over HTTP with 429 and Retry-After, over gRPC with
  RESOURCE_EXHAUSTED and trailing metadata retry-after, each naming the limit.
After each, every block is back."""

import json
import math
import re
import threading
from concurrent.futures import ThreadPoolExecutor
import urllib.error
import urllib.request
from types import SimpleNamespace

import grpc
import openai
import pytest

from services.launcher.child import stop_children
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import gateway_pb2_grpc
from shared.pb.pdserve.v1 import generation_pb2 as gen
from tests.helpers.freeze import Frozen, process_tree

SHEDDING_GATEWAY = "gateway-shedding"
WAIT_GATEWAY = "gateway-tiny-wait"
TINY_WAIT_S = 0.001
BURST = 48  # three times the old default count limit (16 per prefill instance)


@pytest.fixture(scope="module")
def stack(served_stack):
    return served_stack


def extra_gateway(stack, name: str, flags: list[str]):
    """(gRPC address, HTTP address) of another gateway on the stack with `flags`."""
    child = stack.stack.start_extra_gateway(name, flags)
    try:
        yield stack.stack.addresses[name], stack.stack.ready_info[name]["http_address"]
    finally:
        stop_children([child], 10.0)


@pytest.fixture(scope="module")
def shedding_gateway(stack):
    """A gateway that sheds at 1 waiting request per prefill instance (the count limit)."""
    yield from extra_gateway(stack, SHEDDING_GATEWAY, ["--max-queued-per-instance", "1"])


@pytest.fixture(scope="module")
def tiny_wait_gateway(stack):
    """A gateway that admits a request only when nothing is ahead of it (the wait limit is 1 ms)."""
    yield from extra_gateway(stack, WAIT_GATEWAY, ["--max-queue-wait-s", str(TINY_WAIT_S),
                                                   "--prompt-tokens-per-s", "500"])


def engine_cores(instances) -> list[SimpleNamespace]:
    """What each instance started (engine core, workers), to freeze without its service."""
    return [SimpleNamespace(pid=pid) for instance in instances for pid in process_tree(instance.pid)[1:]]


def waiting_first_token(http_address: str) -> int:
    text = urllib.request.urlopen(f"http://{http_address}/metrics", timeout=10).read().decode()
    match = re.search(r"^pdserve:gateway_requests_waiting_first_token\{[^}]*\} (\S+)", text, re.M)
    return int(float(match.group(1))) if match else 0


def post_completion(http_address: str) -> tuple[int, dict, dict]:
    body = json.dumps({"prompt": "Hello", "max_tokens": 2}).encode()
    request = urllib.request.Request(f"http://{http_address}/v1/completions", body,
                                     {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read()), dict(reply.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), {k.lower(): v for k, v in error.headers.items()}


def streamed_chat(client: openai.OpenAI, index: int) -> str | openai.RateLimitError:
    """One short streaming chat (4 tokens, greedy): its text, or the 429 it got."""
    try:
        stream = client.chat.completions.create(
            model="", messages=[{"role": "user", "content": f"Count from {index} to {index + 9}."}],
            max_tokens=4, temperature=0, stream=True)
        return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    except openai.RateLimitError as error:
        return error


def burst(client: openai.OpenAI, num_requests: int) -> list[str | openai.RateLimitError]:
    with ThreadPoolExecutor(num_requests) as pool:
        return list(pool.map(lambda index: streamed_chat(client, index), range(num_requests)))


def test_a_burst_three_times_the_old_count_limit_completes_on_the_default_settings(stack, client):
    outcomes = burst(client, BURST)
    refused = [outcome for outcome in outcomes if isinstance(outcome, openai.RateLimitError)]
    assert not refused, refused[0].message
    assert all(outcome for outcome in outcomes)  # every chat streamed its text


def test_a_burst_over_a_tiny_wait_limit_gets_429s_with_the_predicted_wait_as_retry_after(stack, tiny_wait_gateway):
    _, http_address = tiny_wait_gateway
    with openai.OpenAI(base_url=f"http://{http_address}/v1", api_key="unused", max_retries=0,
                       timeout=120) as client:
        with ThreadPoolExecutor(1) as first:
            with Frozen(*engine_cores(stack.instances("prefill"))):
                admitted = first.submit(streamed_chat, client, 0)
                stack.wait_for(lambda: waiting_first_token(http_address) == 1, 60, "the first request to be admitted")
                outcomes = burst(client, 8)
            outcomes.append(admitted.result(timeout=120))
    refused = [outcome for outcome in outcomes if isinstance(outcome, openai.RateLimitError)]
    assert len(refused) == 8  # one prompt ahead: over 1 ms however fast the prompt rate
    for error in refused:
        predicted_s = float(re.search(r"predicted wait for a first token is ([0-9.]+) s", error.message).group(1))
        assert "over the limit of 0.001 s (max_queue_wait_s)" in error.message
        # Retry-After: when the queue ahead will have drained enough, the predicted wait minus the
        # limit in whole seconds (at least 1); the message gives the wait to 0.1 s.
        retry_after_s = int(error.response.headers["retry-after"])
        assert f"retry after {retry_after_s} s" in error.message
        over_s = (predicted_s - 0.05 - TINY_WAIT_S, predicted_s + 0.05 - TINY_WAIT_S)
        assert max(1.0, over_s[0]) <= retry_after_s < max(1.0, over_s[1]) + 1
    assert isinstance(outcomes[-1], str) and outcomes[-1]  # the admitted request completed
    assert waiting_first_token(http_address) == 0
    stack.wait_all_blocks_free()
    stack.check_children_alive()


def test_a_full_prefill_pool_sheds_with_429_and_resource_exhausted_and_frees_everything(stack, shedding_gateway):
    grpc_address, http_address = shedding_gateway
    request = gw.GenerateRequest(token_ids=gw.TokenIds(ids=list(range(1000, 1040))),
                                 sampling=gen.SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    outcome = []
    with grpc.insecure_channel(grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        with Frozen(*engine_cores(stack.instances("prefill"))):
            first = threading.Thread(target=lambda: outcome.append(list(stub.Generate(request, timeout=120))))
            first.start()
            stack.wait_for(lambda: waiting_first_token(http_address) == 1, 60, "the first request to be admitted")

            status, body, headers = post_completion(http_address)
            assert status == 429, body
            assert body["error"]["type"] == "rate_limit_error"
            assert "max_queued_per_instance=1" in body["error"]["message"]
            assert int(headers["retry-after"]) >= 1
            with pytest.raises(grpc.RpcError) as shed:
                list(stub.Generate(request, timeout=60))
            assert shed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_queued_per_instance=1" in shed.value.details()
            assert int(dict(shed.value.trailing_metadata())["retry-after"]) >= 1
        first.join(timeout=120)
    assert outcome and outcome[0][-1].usage.completion_tokens == 4
    assert waiting_first_token(http_address) == 0
    stack.wait_all_blocks_free()
    stack.check_children_alive()
