"""Load shedding with real processes: a gateway started with --max-queued-per-instance 1 on the
shared stack (1 prefill + 1 decode). The prefill instance's engine core is frozen (its service
still answers health checks and heartbeats, as a busy instance does), so a first request waits
for its first token however fast the machine is; a second request is then refused at once, over HTTP
with 429 and Retry-After, over gRPC with RESOURCE_EXHAUSTED and trailing metadata retry-after,
each naming the limit. After the thaw the first request completes and every block is back."""

import json
import re
import threading
import urllib.error
import urllib.request
from types import SimpleNamespace

import grpc
import pytest

from services.launcher.child import stop_children
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import gateway_pb2_grpc
from shared.pb.pdserve.v1 import generation_pb2 as gen
from tests.helpers.freeze import Frozen, process_tree

SHEDDING_GATEWAY = "gateway-shedding"


@pytest.fixture(scope="module")
def stack(served_stack):
    return served_stack


@pytest.fixture(scope="module")
def shedding_gateway(stack):
    """(gRPC address, HTTP address) of a second gateway with a limit of 1 waiting request per prefill instance."""
    child = stack.stack.start_extra_gateway(SHEDDING_GATEWAY, ["--max-queued-per-instance", "1"])
    try:
        ready = stack.stack.ready_info[SHEDDING_GATEWAY]
        yield stack.stack.addresses[SHEDDING_GATEWAY], ready["http_address"]
    finally:
        stop_children([child], 10.0)


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
