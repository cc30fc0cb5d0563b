"""Peer reuse between instance services, in-process: real gRPC servers, real UCX over loopback,
real Redis, the tiny fp32 model. A prefill instance told (PrefillRequest.peer_source) that a
peer holds more of its prompt pulls those blocks over UCX and computes only the rest: from
another prefill instance, and from the decode instance that generated a conversation's
previous turn. A holder that no longer has the blocks, or cannot be reached, only means the
prompt is computed. Every answer equals the offline engine's; every block comes back."""

import asyncio
import contextlib

from shared.pb.pdserve.v1 import instance_pb2 as pb
from tests.unit.test_instance_services import (  # noqa: F401 - fresh_ucx and offline are fixtures
    TIMEOUT_S, fresh_ucx, greedy, make_settings, offline, offline_output, prompt_ids, reserve, run_disaggregated,
    running,
)

PROMPT = prompt_ids(70, 11)  # 4 full blocks of 16 and 6 tokens


@contextlib.asynccontextmanager
async def three_instances(folder, redis_url: str):
    """Prefill p1 (a holder), prefill p2 (the puller) and decode d0, peer reuse on everywhere."""
    async with running(make_settings("prefill", folder, redis_url, instance_id="p1")) as p1, \
            running(make_settings("prefill", folder, redis_url, instance_id="p2")) as p2, \
            running(make_settings("decode", folder, redis_url, instance_id="d0")) as d0:
        yield p1, p2, d0


def peer_source(holder, num_blocks: int, num_local_blocks: int = 0) -> pb.PeerSource:
    return pb.PeerSource(instance_id=holder.runtime.instance_id, grpc_address=holder.runtime.grpc_address,
                         num_blocks=num_blocks, num_local_blocks=num_local_blocks)


async def run_with_peer(prefill, decode, request_id: str, prompt: list[int], source: pb.PeerSource, max_tokens=6):
    """Reserve on `decode`, Prefill on `prefill` naming `source`, Decode: (prefill answer, tokens)."""
    sampling = greedy(max_tokens)
    reserved = await reserve(decode, request_id, prompt, sampling)
    prefilled = await prefill.stub.Prefill(pb.PrefillRequest(
        request_id=request_id, prompt_token_ids=prompt, sampling=sampling, decode_ucx_address=reserved.ucx_address,
        dst_block_ids=list(reserved.block_ids), num_skip_blocks=reserved.num_skip_blocks,
        transfer_token=reserved.transfer_token, peer_source=source), timeout=TIMEOUT_S)
    messages = [m async for m in decode.stub.Decode(pb.DecodeRequest(
        request_id=request_id, first_token_id=prefilled.first_token_id), timeout=TIMEOUT_S)]
    return prefilled, [token for message in messages for token in message.token_ids]


def peer_stats(instance):
    return instance.runtime.handlers.prefill.peers.stats()


def test_a_prefix_is_pulled_from_a_peer_prefill_instance(redis_server, tiny_llama_folder, offline):
    expected = offline_output(offline, PROMPT, temperature=0.0, max_tokens=6, ignore_eos=True).token_ids

    async def scenario():
        async with three_instances(tiny_llama_folder, redis_server.url) as (p1, p2, d0):
            first = await run_disaggregated(p1, d0, "r1", PROMPT, greedy(6))
            assert first.token_ids == expected
            prefilled, tokens = await run_with_peer(p2, d0, "r2", PROMPT, peer_source(p1, 4))
            assert tokens == expected
            assert prefilled.num_peer_prompt_tokens == 64 and prefilled.num_cached_prompt_tokens == 64
            stats = peer_stats(p2)
            assert (stats.num_loads, stats.num_load_decisions, stats.recompute_avoided_tokens) == (4, 1, 64)
            assert p1.runtime.handlers.peer.num_blocks_sent == 4
    asyncio.run(scenario())


def test_the_next_turn_pulls_the_decode_instances_conversation(redis_server, tiny_llama_folder, offline):
    async def scenario():
        async with three_instances(tiny_llama_folder, redis_server.url) as (p1, p2, d0):
            first = await run_disaggregated(p1, d0, "turn-1", PROMPT, greedy(20))
            conversation = PROMPT + first.token_ids  # 90 tokens: d0 holds 5 full blocks (prompt and output)
            next_turn = conversation + prompt_ids(12, 12)
            expected = offline_output(offline, next_turn, temperature=0.0, max_tokens=6, ignore_eos=True).token_ids
            prefilled, tokens = await run_with_peer(p2, d0, "turn-2", next_turn, peer_source(d0, 5))
            assert tokens == expected
            assert prefilled.num_peer_prompt_tokens == 80  # 5 blocks, one of them made of output tokens
            assert d0.runtime.handlers.peer.num_sends == 1
    asyncio.run(scenario())


def test_a_holder_without_the_blocks_or_out_of_reach_leaves_the_prompt_to_be_computed(
        redis_server, tiny_llama_folder, offline):
    expected = offline_output(offline, PROMPT, temperature=0.0, max_tokens=6, ignore_eos=True).token_ids

    async def scenario():
        async with three_instances(tiny_llama_folder, redis_server.url) as (p1, p2, d0):
            prefilled, tokens = await run_with_peer(p2, d0, "r1", PROMPT, peer_source(p1, 4))  # p1 holds nothing
            assert tokens == expected and prefilled.num_peer_prompt_tokens == 0
            assert p1.runtime.handlers.peer.num_refused == 1
            other = prompt_ids(70, 13)
            gone = pb.PeerSource(instance_id="gone", grpc_address="127.0.0.1:9", num_blocks=4)
            prefilled, tokens = await run_with_peer(p1, d0, "r2", other, gone)
            assert prefilled.num_peer_prompt_tokens == 0
            assert tokens == offline_output(offline, other, temperature=0.0, max_tokens=6, ignore_eos=True).token_ids
            assert peer_stats(p2).num_misses == 4 and peer_stats(p1).num_misses == 4  # the blocks asked for
    asyncio.run(scenario())
