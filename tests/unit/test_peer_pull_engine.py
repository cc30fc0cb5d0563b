"""Peer reuse between two engines of one process (the in-memory KV connector): a puller
reserves a prefix, the holder sends the blocks it holds, the puller keeps them as prefix-cache
entries and its prompt starts after them. A failed send or a holder that lacks the blocks
leaves the puller computing the prompt itself, with the same tokens, and every block back."""

import pytest

from shared.engine import SamplingParams
from shared.engine_api.client import CachedSend
from shared.errors import InvalidRequestError
from tests.unit.kv_split import connected_llm, kv_arrivals

GREEDY = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
PROMPT = [(13 * i) % 190 + 5 for i in range(75)]  # 4 full blocks of 16, then 11 tokens
PREFIX = PROMPT[:64]


def pull(holder, puller, num_skip_hint: int = 0, request_id: str = "pull-1"):
    """Reserve PREFIX on the puller, have the holder send it; (blocks sent, arrivals)."""
    reservation = puller.engine.reserve_request(PREFIX, SamplingParams(max_tokens=1), request_id)
    send = CachedSend(request_id, tuple(PREFIX), None, reservation.num_skip_blocks,
                      puller.engine.core.connector.address, tuple(reservation.block_ids), reservation.transfer_token)
    num_sent = holder.engine.send_cached(send)
    holder.engine.step()  # the holder lets go of the blocks once the send is reported
    puller.engine.step()  # the puller commits the arrival
    return num_sent, kv_arrivals(puller.engine)


def assert_pool_is_whole(llm) -> None:
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks


@pytest.fixture
def pair(tiny_llama_folder):
    holder, puller = connected_llm(tiny_llama_folder), connected_llm(tiny_llama_folder)
    reference = holder.generate([PROMPT], GREEDY)[0].outputs[0].token_ids  # the holder now caches PROMPT
    return holder, puller, reference


def test_pulled_blocks_are_prefix_hits_with_the_same_tokens(pair):
    holder, puller, reference = pair
    num_sent, arrivals = pull(holder, puller)
    assert num_sent == 4 and arrivals == [("pull-1", None)]
    assert puller.engine.release_reserved("pull-1", keep_arrived=True)
    output = puller.generate([PROMPT], GREEDY)[0]
    assert output.num_cached_tokens == 64 and output.outputs[0].token_ids == reference
    assert_pool_is_whole(holder)
    assert_pool_is_whole(puller)


def test_only_the_blocks_the_puller_lacks_travel(pair):
    holder, puller, reference = pair
    puller.generate([PREFIX[:40]], SamplingParams(max_tokens=1))  # the puller caches 2 blocks itself
    num_sent, _ = pull(holder, puller)
    assert num_sent == 2
    puller.engine.release_reserved("pull-1", keep_arrived=True)
    assert puller.generate([PROMPT], GREEDY)[0].outputs[0].token_ids == reference
    assert_pool_is_whole(puller)


def test_a_failed_send_leaves_the_prompt_to_be_computed(pair):
    holder, puller, reference = pair
    holder.engine.core.connector.fail_next_sends = 1
    _, [(request_id, error)] = pull(holder, puller)
    assert request_id == "pull-1" and "injected" in error
    puller.engine.release_reserved("pull-1", keep_arrived=True)  # nothing arrived: nothing kept
    output = puller.generate([PROMPT], GREEDY)[0]
    assert output.num_cached_tokens == 0 and output.outputs[0].token_ids == reference
    assert_pool_is_whole(holder)
    assert_pool_is_whole(puller)


def test_a_holder_without_the_blocks_refuses_and_holds_nothing(pair, tiny_llama_folder):
    _, puller, _ = pair
    stranger = connected_llm(tiny_llama_folder)
    reservation = puller.engine.reserve_request(PREFIX, SamplingParams(max_tokens=1), "pull-2")
    send = CachedSend("pull-2", tuple(PREFIX), None, 0, puller.engine.core.connector.address,
                      tuple(reservation.block_ids), reservation.transfer_token)
    with pytest.raises(InvalidRequestError, match="holds 0 of the 4 blocks"):
        stranger.engine.send_cached(send)
    with pytest.raises(InvalidRequestError, match="whole blocks"):
        stranger.engine.send_cached(CachedSend("x", tuple(PREFIX[:20]), None, 0, "memory:0", (1, 2), b""))
    puller.engine.release_reserved("pull-2")
    assert_pool_is_whole(stranger)
    assert_pool_is_whole(puller)
