"""KV beyond one instance's pool, on a real stack: Redis, a gateway, two prefill instances and
one decode instance as processes, SmolLM2 in fp32, 48-block pools so that eviction happens,
one host tier shared by the three, written only on eviction (no write-through: what the pools
still hold can then only come from the instance holding it, over UCX).

- A prompt evicted from every pool is loaded back from the host tier instead of computed.
- A prefill instance pulls a prompt another prefill instance computed.
- A holder killed while a pull waits on it leaves the prompt computed here.
- A chat's next turn, through the gateway, pulls the previous turn's blocks (prompt and output)
  from the decode instance that generated them.

Greedy output equals computing everything from scratch; every live instance ends each test
with all its blocks free; the counters (Prometheus, and the Redis board `pdserve status`
reads) show where blocks came from.
"""

import asyncio
import os
import signal
import threading

import grpc
import pytest
import redis.asyncio

from shared.cluster.tier_board import TierBoard
from shared.engine import LLM, SamplingParams
from shared.pb.pdserve.v1 import instance_pb2
from tests.helpers.gateway_client import generate, generate_request, random_token_ids, sampling
from tests.helpers.stack import running_stack
from tests.unit.metrics_scrape import scrape, value

DTYPE = "float32"
BLOCK_SIZE = 16
NUM_BLOCKS = 48
# Long enough that only the holder's death ends a pull waiting on it (never this timeout).
PEER_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def stack(smollm2_folder, tmp_path_factory):
    yield from running_stack(smollm2_folder, DTYPE, num_prefill=2, num_decode=1,
                             run_dir=tmp_path_factory.mktemp("tiers_and_peers"),
                             extra_args={"instance": ["--num-blocks", str(NUM_BLOCKS), "--no-kv-tier-write-through",
                                                      "--kv-peer-timeout-s", str(PEER_TIMEOUT_S)]})


@pytest.fixture(scope="module")
def reference(smollm2_folder) -> LLM:
    """Every prompt computed from scratch (no prefix cache, no tier)."""
    return LLM(model=str(smollm2_folder), dtype=DTYPE, num_threads=1, enable_prefix_caching=False)


@pytest.fixture(autouse=True)
def no_stranded_blocks(stack):
    yield
    stack.wait_all_blocks_free()


def expected_tokens(reference: LLM, prompt: list[int], max_tokens: int) -> list[int]:
    return reference.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens,
                                                       ignore_eos=True))[0].outputs[0].token_ids


def ask(stack, prompt: list[int], max_tokens: int):
    return generate(stack.gateway, generate_request(token_ids=prompt, max_tokens=max_tokens, ignore_eos=True))


def metric(stack, name: str, metric_name: str, **labels) -> float:
    return value(scrape(stack.stack.ready_info[name]["metrics_address"]), metric_name, **labels)


def summed(stack, metric_name: str, **labels) -> float:
    return sum(metric(stack, instance.name, metric_name, **labels) for instance in stack.instances("prefill"))


def tier_board(stack) -> dict:
    async def read():
        async with redis.asyncio.Redis.from_url(stack.stack.redis_url) as client:
            return await TierBoard(client, stack.namespace, ttl_s=1.0).read(i.name for i in stack.instances())
    return asyncio.run(read())


def prefill_with_peer(stack, prefill, holder, request_id: str, prompt: list[int], num_blocks: int):
    """Reserve on the decode instance, Prefill on `prefill` naming `holder` (as the gateway
    would), Decode: (the prefill's answer, the tokens)."""
    decode = stack.stub(stack.instances("decode")[0])
    params = sampling(max_tokens=6, ignore_eos=True)
    reserved = decode.Reserve(instance_pb2.ReserveRequest(request_id=request_id, prompt_token_ids=prompt,
                                                          sampling=params, lease_ms=300_000), timeout=30)
    source = instance_pb2.PeerSource(instance_id=holder.name, grpc_address=holder.address, num_blocks=num_blocks)
    prefilled = stack.stub(prefill).Prefill(instance_pb2.PrefillRequest(
        request_id=request_id, prompt_token_ids=prompt, sampling=params, decode_ucx_address=reserved.ucx_address,
        dst_block_ids=reserved.block_ids, num_skip_blocks=reserved.num_skip_blocks,
        transfer_token=reserved.transfer_token, peer_source=source), timeout=PEER_TIMEOUT_S + 60)
    tokens = [token for message in decode.Decode(instance_pb2.DecodeRequest(
        request_id=request_id, first_token_id=prefilled.first_token_id), timeout=60) for token in message.token_ids]
    return prefilled, tokens


def compute_on(stack, holder, prompt: list[int]) -> None:
    """Have `holder` compute `prompt` (a prompt-only Prefill: nothing sent) and publish it."""
    stack.stub(holder).Prefill(instance_pb2.PrefillRequest(
        request_id=f"compute-{holder.name}-{len(prompt)}-{prompt[0]}", prompt_token_ids=prompt,
        sampling=sampling(max_tokens=1)), timeout=120)
    num_blocks = (len(prompt) - 1) // BLOCK_SIZE
    stack.wait_for(lambda: stack.prefix_holders(prompt, {holder.name})[holder.name] >= num_blocks, 10.0,
                   f"{holder.name} holding the prompt in the prefix index")


def prefill_instance(stack, name: str):
    return next(instance for instance in stack.instances("prefill") if instance.name == name)


def test_a_prompt_evicted_from_every_pool_is_loaded_back_from_the_host_tier(stack, reference):
    prompt = random_token_ids(200, seed=301)  # 12 full blocks before its last token
    first = ask(stack, prompt, 8)
    assert first.token_ids == expected_tokens(reference, prompt, 8)
    for seed in range(4):  # 4 x 19 blocks through 48-block pools: the prompt's blocks are reused
        ask(stack, random_token_ids(300, seed=310 + seed), 2)
    loads_before = summed(stack, "pdserve:kv_tier_loads_total", tier="host")
    again = ask(stack, prompt, 8)
    assert again.token_ids == first.token_ids
    assert again.usage.cached_prompt_tokens == 12 * BLOCK_SIZE
    assert summed(stack, "pdserve:kv_tier_loads_total", tier="host") - loads_before == 12
    board = stack.wait_for(lambda: [tier for tiers in tier_board(stack).values() for tier in tiers
                                    if tier.tier == "host" and tier.num_loads], 10.0, "the tier board's loads")
    assert sum(tier.recompute_avoided_tokens for tier in board) >= 12 * BLOCK_SIZE


def test_a_prefill_instance_pulls_what_another_one_computed(stack, reference):
    # Each puller of this module pulls here first: its load-or-recompute choice starts from the
    # seeded costs, in which pulling 8 blocks wins by far (later, measured on a busy machine,
    # a slow pull may rightly lose to computing).
    prompt = random_token_ids(150, seed=411)
    holder, puller = prefill_instance(stack, "prefill-0"), prefill_instance(stack, "prefill-1")
    compute_on(stack, holder, prompt[:130])  # 8 full blocks
    prefilled, tokens = prefill_with_peer(stack, puller, holder, "peer-pull-1", prompt, 8)
    assert tokens == expected_tokens(reference, prompt, 6)
    assert prefilled.num_peer_prompt_tokens == prefilled.num_cached_prompt_tokens == 8 * BLOCK_SIZE


def test_a_holder_killed_while_a_pull_waits_on_it_leaves_the_prompt_computed(stack, reference):
    prompt = random_token_ids(150, seed=421)
    # prefill-0 has not pulled yet: its choice starts from the seeded costs too.
    holder, puller = prefill_instance(stack, "prefill-1"), prefill_instance(stack, "prefill-0")
    compute_on(stack, holder, prompt[:130])
    misses_before = metric(stack, puller.name, "pdserve:kv_tier_misses_total", tier="peer")
    os.kill(holder.pid, signal.SIGSTOP)  # the pull's SendCachedBlocks waits on it
    result = {}

    def run():
        try:
            result["answer"] = prefill_with_peer(stack, puller, holder, "peer-pull-2", prompt, 8)
        except grpc.RpcError as error:
            result["error"] = error
    client = threading.Thread(target=run)
    client.start()
    try:
        stack.wait_for(lambda: metric(stack, puller.name, "pdserve:kv_peer_pulls_in_flight") == 1, 60.0,
                       "the pull to wait on the holder")
    finally:
        stack.kill(holder)  # SIGKILL, mid-pull
    client.join(timeout=PEER_TIMEOUT_S)
    assert "error" not in result, result.get("error")
    prefilled, tokens = result["answer"]
    assert tokens == expected_tokens(reference, prompt, 6)
    assert prefilled.num_peer_prompt_tokens == 0
    assert metric(stack, puller.name, "pdserve:kv_tier_misses_total", tier="peer") == misses_before + 8


def test_the_next_turn_pulls_the_conversation_from_the_decode_instance(stack, reference):
    """Through the gateway, with the prefill instance left after the kill above."""
    first_prompt = random_token_ids(110, seed=401)
    first = ask(stack, first_prompt, 24)
    conversation = first_prompt + first.token_ids
    num_blocks = (len(conversation) - 1) // BLOCK_SIZE  # what the decode instance computed: 8 blocks
    stack.wait_for(lambda: stack.prefix_holders(conversation, {"decode-0"})["decode-0"] >= num_blocks, 10.0,
                   "the decode instance's conversation in the prefix index")
    pulled_before = summed(stack, "pdserve:kv_tier_loads_total", tier="peer")
    next_turn = conversation + random_token_ids(30, seed=402)
    answer = ask(stack, next_turn, 8)
    assert answer.token_ids == expected_tokens(reference, next_turn, 8)
    assert answer.usage.cached_prompt_tokens == num_blocks * BLOCK_SIZE
    # The turn's prompt blocks were in the prefill instance's pool; the output's came from decode-0.
    assert summed(stack, "pdserve:kv_tier_loads_total", tier="peer") - pulled_before >= 1
