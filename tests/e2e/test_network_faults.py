"""Network faults on the KV and control paths of a real stack (2 prefill + 2 decode instances,
a gateway, Redis; separate processes, real UCX over loopback), injected with
benchmarks.harness.netfault and healed within each test:

- a partition, or a reset of every connection, between one prefill and one decode instance:
  the prefill's KV send fails (within --kv-transfer-timeout-s for a partition, at once for a
  reset), the gateway retries the prompt on the other prefill instance, every request
  completes with the greedy tokens it gets without faults;
- a transfer held up on the way (its packets held, not dropped) until its reservation was
  released, the blocks reserved by another request and filled with that request's KV: the
  decode instance refuses it when it arrives, the other request's output is untouched (the
  decode instances have few blocks, so the reuse is certain);
- a partition between a decode instance and Redis: its registration lapses, gateways route
  around it, requests complete; healed, it registers again.

Tests wait on observable events (a fault's packet counter, registrations), never on sleeps.
Needs root, iptables and cgroup v2 (skips naming what is missing).
"""


import grpc
import pytest

from benchmarks.harness import netfault
from shared.kv_transfer.address import parse_address
from shared.pb.pdserve.v1 import instance_pb2 as pb
from tests.helpers.gateway_client import generate, generate_request, random_token_ids
from tests.helpers.stack import StackHarness, make_stack_config, running_supervised_stack

DTYPE = "float32"  # outputs compared token for token with a fault-free run
KV_TRANSFER_TIMEOUT_S = 4.0  # also bounds how long the canary may hold its late send
HEARTBEAT_TTL_S = 4.0
MAX_TOKENS = 6
TIMEOUT_S = 60.0
# Few KV blocks on the decode instances, so that a reservation made right after another was
# released must reuse some of its blocks: 3 blocks of 16 tokens for the late prompt, 7 for the
# reuser's, 8 in all. Enough for the other tests, whose requests run one at a time.
DECODE_BLOCKS = 8
LATE_PROMPT_TOKENS = 40
REUSER_PROMPT_TOKENS = 100
HOLD_MS = 600_000  # packets held until the fault is healed


@pytest.fixture(scope="module")
def injector():
    reason = netfault.missing_prerequisite()
    if reason is not None:
        pytest.skip(reason)
    netfault.remove_leftovers()
    yield netfault
    netfault.heal_all()


@pytest.fixture(scope="module")
def stack(injector, smollm2_folder, tmp_path_factory):
    config = make_stack_config(smollm2_folder, DTYPE, run_dir=tmp_path_factory.mktemp("netfaults"), extra_args={
        "instance": ["--num-blocks", "256", "--heartbeat-interval-s", "0.5", "--heartbeat-ttl-s", str(HEARTBEAT_TTL_S),
                     "--kv-transfer-timeout-s", str(KV_TRANSFER_TIMEOUT_S), "--no-kv-peer-reuse"],
        "decode": ["--num-blocks", str(DECODE_BLOCKS)],
        "gateway": ["--lease-s", "5"]})
    yield from running_supervised_stack(config, smollm2_folder)


def target(harness: StackHarness, name: str) -> netfault.Target:
    instance = harness.instance(name)
    grpc_port = parse_address(instance.address)[1]
    return netfault.process_target(name, instance.pid).without_ports(grpc_port)


def prompts(count: int, seed: int) -> list[list[int]]:
    return [random_token_ids(40, seed=seed + i) for i in range(count)]


def run(harness: StackHarness, prompt: list[int]) -> list[int]:
    request = generate_request(token_ids=prompt, max_tokens=MAX_TOKENS, ignore_eos=True)
    return list(generate(harness.gateway, request, TIMEOUT_S).token_ids)


@pytest.mark.parametrize("kind", ["partition", "reset"])
def test_a_cut_between_a_prefill_and_a_decode_instance_fails_over_to_the_other_prefill(stack, injector, kind):
    prefill, decode = (stack.instances(role)[0].name for role in ("prefill", "decode"))
    batch = prompts(4, seed=100)
    expected = [run(stack, prompt) for prompt in batch]
    with injector.injected(kind, target(stack, prefill), target(stack, decode)) as fault:
        outputs = []
        for prompt in batch * 3:  # until the cut pair has been tried (the router picks the pair)
            outputs.append(run(stack, prompt))
            if fault.packets_matched() > 0 and len(outputs) >= len(batch):
                break
        assert fault.packets_matched() > 0, "no request tried the cut pair"
    assert outputs == (expected * 3)[:len(outputs)]
    stack.wait_all_blocks_free()


def test_a_transfer_arriving_after_its_reservation_was_released_and_reused_is_refused(stack, injector):
    """The canary: a KV send to decode-0 is held up on the way (every packet between its prefill
    instance and decode-0 held, not dropped, until healed); meanwhile its reservation is released,
    the blocks reserved by another request and filled with that request's KV by the other prefill
    instance. Healed, the held send arrives, late, into blocks that now hold someone else's KV:
    it must be refused, and the other request's greedy output must be its fault-free output."""
    (prefill, other_prefill), (decode, other_decode) = stack.instances("prefill"), stack.instances("decode")
    late_prompt = random_token_ids(LATE_PROMPT_TOKENS, seed=200)
    reuser_prompt = random_token_ids(REUSER_PROMPT_TOKENS, seed=201)
    sampling = generate_request(token_ids=[1], max_tokens=MAX_TOKENS, ignore_eos=True).sampling
    # Fault-free, elsewhere; this also leaves the prompt in the other prefill instance's prefix
    # cache, so that filling the reused blocks below is quick while the late send is held.
    expected = prefill_and_decode(stack, other_prefill, other_decode, "reuser-expected", reuser_prompt, sampling)
    prefill_and_decode(stack, prefill, decode, "warm", late_prompt, sampling)  # a connection to hold
    prefill_stub, decode_stub = stack.stub(prefill), stack.stub(decode)
    late = reserve(decode_stub, "late", late_prompt, sampling)
    with injector.injected("latency", target(stack, prefill.name), target(stack, decode.name),
                           delay_ms=HOLD_MS) as held:
        call = prefill_stub.Prefill.future(prefill_request(late, "late", late_prompt, sampling), timeout=TIMEOUT_S)
        stack.wait_for(lambda: held.packets_matched() > 0, TIMEOUT_S, "the late KV to be held", interval_s=0.05)
        assert decode_stub.Release(pb.ReleaseRequest(request_id="late")).released
        reuser = reserve(decode_stub, "reuser", reuser_prompt, sampling)
        late_written = set(late.block_ids[late.num_skip_blocks:])  # the blocks the late send writes
        assert late_written & set(reuser.block_ids), f"the reuser got none of {late_written}: {reuser.block_ids}"
        first_token = stack.stub(other_prefill).Prefill(
            prefill_request(reuser, "reuser", reuser_prompt, sampling), timeout=TIMEOUT_S).first_token_id
        # healed: the held packets go now, into blocks that hold the reuser's KV
    with pytest.raises(grpc.RpcError) as refused:
        call.result()
    assert refused.value.code() == grpc.StatusCode.ABORTED
    assert "no transfer expected for 'late'" in refused.value.details(), refused.value.details()
    assert [first_token, *decode_tokens(decode_stub, "reuser", first_token)] == expected
    stack.wait_all_blocks_free()


def reserve(decode_stub, request_id: str, prompt: list[int], sampling) -> pb.ReserveResponse:
    return decode_stub.Reserve(pb.ReserveRequest(request_id=request_id, prompt_token_ids=prompt, sampling=sampling),
                               timeout=TIMEOUT_S)


def prefill_and_decode(harness: StackHarness, prefill, decode, request_id: str, prompt: list[int],
                       sampling) -> list[int]:
    """One request straight through a prefill and a decode instance (no gateway): its tokens."""
    reserved = reserve(harness.stub(decode), request_id, prompt, sampling)
    first_token = harness.stub(prefill).Prefill(prefill_request(reserved, request_id, prompt, sampling),
                                                timeout=TIMEOUT_S).first_token_id
    return [first_token, *decode_tokens(harness.stub(decode), request_id, first_token)]


def decode_tokens(decode_stub, request_id: str, first_token: int) -> list[int]:
    stream = decode_stub.Decode(pb.DecodeRequest(request_id=request_id, first_token_id=first_token), timeout=TIMEOUT_S)
    return [token for message in stream for token in message.token_ids]


def prefill_request(reserved: pb.ReserveResponse, request_id: str, prompt: list[int], sampling) -> pb.PrefillRequest:
    return pb.PrefillRequest(request_id=request_id, prompt_token_ids=prompt, sampling=sampling,
                             decode_ucx_address=reserved.ucx_address, dst_block_ids=list(reserved.block_ids),
                             num_skip_blocks=reserved.num_skip_blocks, transfer_token=reserved.transfer_token)


def test_a_decode_instance_cut_from_redis_is_routed_around_and_registers_again(stack, injector):
    decode = stack.instances("decode")[0].name
    batch = prompts(3, seed=300)
    expected = [run(stack, prompt) for prompt in batch]
    redis_port = parse_address(stack.stack.redis_url.removeprefix("redis://").split("/")[0])[1]
    redis = netfault.port_target("redis", redis_port)
    with injector.injected("partition", target(stack, decode), redis):
        stack.wait_for(lambda: decode not in stack.registered_ids("decode"), TIMEOUT_S, f"{decode} to drop out")
        assert [run(stack, prompt) for prompt in batch] == expected
    stack.wait_for(lambda: decode in stack.registered_ids("decode"), TIMEOUT_S, f"{decode} to register again")
    assert [run(stack, prompt) for prompt in batch] == expected
    stack.wait_all_blocks_free()

