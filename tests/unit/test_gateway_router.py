"""Pure routing decisions of the gateway: exact choices and reasons; prefill and decode
instances pair only when their registered cache settings agree."""

from dataclasses import replace

from services.gateway.router import (
    COLOCATED, DISAGGREGATED, Candidate, no_pair_reason, pairable_decodes, plan_route, prefills_for, rank)
from shared.engine_api.client import CacheSettings

CACHE = CacheSettings(model_id="m", block_size=16, prefix_hash_algo="sha256", dtype="bfloat16",
                      kv_layout="kv,layer,block,slot,kv_head,head_dim;layers=2;kv_heads=2;head_dim=8")


def decode(instance_id, prefix=0, free=10, running=0, suspect=False, cache=CACHE):
    return Candidate(instance_id, "decode", f"{instance_id}:1", prefix_blocks=prefix, free_blocks=free,
                     total_blocks=100, num_running=running, is_suspect=suspect, cache=cache)


def prefill(instance_id, prefix=0, queue=0, running=0, suspect=False, cache=CACHE):
    return Candidate(instance_id, "prefill", f"{instance_id}:1", prefix_blocks=prefix, queue_depth=queue,
                     num_running=running, is_suspect=suspect, cache=cache)


def colocated(instance_id, prefix=0, queue=0, running=0, free=10):
    return Candidate(instance_id, "colocated", f"{instance_id}:1", prefix_blocks=prefix, queue_depth=queue,
                     num_running=running, free_blocks=free)


def ids(choice):
    return [c.instance_id for c in choice.ranked]


def test_decode_prefers_prefix_then_free_blocks_then_fewest_running():
    candidates = [decode("d0", free=90), decode("d1", prefix=2, free=5), decode("d2", prefix=3, free=1),
                  decode("d3", free=90, running=1), decode("d4", free=50)]
    choice = rank(candidates, "decode")
    assert ids(choice) == ["d2", "d1", "d0", "d3", "d4"]
    assert choice.reason == "prefix"


def test_decode_by_load_when_no_prefix():
    choice = rank([decode("d0", free=10), decode("d1", free=20), decode("d2", free=20, running=3)], "decode")
    assert ids(choice) == ["d1", "d2", "d0"]
    assert choice.reason == "load"


def test_decode_ties_broken_by_instance_id():
    assert ids(rank([decode("b"), decode("a"), decode("c")], "decode")) == ["a", "b", "c"]


def test_prefill_prefers_prefix_then_shortest_queue():
    candidates = [prefill("p0", queue=0), prefill("p1", prefix=4, queue=9), prefill("p2", queue=1),
                  prefill("p3", queue=0, running=2)]
    choice = rank(candidates, "prefill")
    assert ids(choice) == ["p1", "p0", "p3", "p2"]
    assert choice.reason == "prefix"
    assert rank([prefill("p0", queue=3), prefill("p1", queue=1)], "prefill").reason == "load"


def test_excluded_instances_and_other_roles_are_left_out():
    candidates = [prefill("p0", prefix=5), prefill("p1"), decode("d0"), colocated("c0")]
    choice = rank(candidates, "prefill", excluded={"p0"})
    assert ids(choice) == ["p1"]
    assert choice.reason == "only"
    empty = rank(candidates, "prefill", excluded={"p0", "p1"})
    assert (ids(empty), empty.reason) == ([], "none")


def test_suspect_instances_go_last_even_with_a_prefix():
    choice = rank([prefill("p0", prefix=8, suspect=True), prefill("p1", queue=5)], "prefill")
    assert ids(choice) == ["p1", "p0"]
    assert choice.reason == "load"


def test_colocated_prefers_prefix_then_least_busy():
    candidates = [colocated("c0", queue=1, running=1), colocated("c1", running=1),
                  colocated("c2", prefix=1, queue=5)]
    assert ids(rank(candidates, "colocated")) == ["c2", "c1", "c0"]


def test_plan_route_pair_first_colocated_as_fallback_or_when_preferred():
    pair = [prefill("p0"), decode("d0")]
    assert plan_route(pair) == DISAGGREGATED
    assert plan_route(pair + [colocated("c0")]) == DISAGGREGATED
    assert plan_route(pair + [colocated("c0")], prefer_colocated=True) == COLOCATED
    assert plan_route([prefill("p0"), colocated("c0")]) == COLOCATED
    assert plan_route([decode("d0"), colocated("c0")]) == COLOCATED
    assert plan_route([decode("d0")]) is None
    assert plan_route([]) is None
    assert plan_route(pair, prefer_colocated=True) == DISAGGREGATED


def test_only_instances_with_equal_cache_settings_pair():
    blocks_32 = replace(CACHE, block_size=32)
    candidates = [prefill("p0"), prefill("p1", cache=blocks_32), decode("d0", cache=replace(CACHE, dtype="float32")),
                  decode("d1", cache=blocks_32), decode("d2"), decode("d3", cache=None)]
    assert ids(rank(pairable_decodes(candidates), "decode")) == ["d1", "d2"]
    assert [c.instance_id for c in prefills_for(candidates[3], candidates)] == ["p1"]
    assert [c.instance_id for c in prefills_for(candidates[4], candidates)] == ["p0"]
    assert prefills_for(candidates[2], candidates) == prefills_for(candidates[5], candidates) == []


def test_tensor_parallel_size_does_not_prevent_pairing():
    # The KV wire carries the full layout: a TP=3 decode instance takes a TP=1 prefill's KV.
    pair = [prefill("p0"), decode("d0", cache=replace(CACHE, tensor_parallel_size=3))]
    assert plan_route(pair) == DISAGGREGATED


def test_a_mismatched_pair_is_no_route_and_the_reason_names_the_difference():
    mismatched = [prefill("p0"), decode("d0", cache=replace(CACHE, block_size=32, prefix_hash_algo="blake2b"))]
    assert plan_route(mismatched) is None
    assert plan_route(mismatched + [colocated("c0")]) == COLOCATED
    assert no_pair_reason(mismatched) == ("no prefill and decode instance can pair: prefill p0 and decode d0 "
                                          "differ in cache settings (block_size 16 != 32, "
                                          "prefix_hash_algo sha256 != blake2b)")
    unregistered = [prefill("p0", cache=None), decode("d0")]
    assert plan_route(unregistered) is None
    assert "cache settings not registered" in no_pair_reason(unregistered)
    assert no_pair_reason([decode("d0")]) == "no live prefill instance"
    assert no_pair_reason([]) == "no live prefill or decode instance"


def test_blocks_in_a_host_tier_count_nearly_as_much_as_pool_blocks():
    tiered = replace(prefill("p0", prefix=1), tier_blocks=4)  # 5 blocks usable, 4 of them from its host tier
    choice = rank([prefill("p1", prefix=4), tiered, prefill("p2", prefix=5)], "prefill")
    assert ids(choice) == ["p2", "p0", "p1"]  # a pool hit wins the tie against the same run in a tier
    assert tiered.local_blocks == 5 and tiered.held_blocks < 5


def test_a_prefill_instance_is_told_which_peer_holds_more_of_the_prompt():
    from services.gateway.peer_source import add_peer_source, best_holder
    from shared.pb.pdserve.v1 import instance_pb2

    target = replace(prefill("p0", prefix=2), tier_blocks=1)
    other_cache = replace(CACHE, block_size=32)
    candidates = [target, prefill("p1", prefix=3, queue=5), decode("d0", prefix=6, running=1), decode("d1", prefix=6),
                  decode("d2", prefix=9, suspect=True), decode("d3", prefix=9, cache=other_cache)]
    assert best_holder(target, candidates).instance_id == "d1"  # most blocks, least loaded; never suspect or
    message = instance_pb2.PrefillRequest(request_id="r")           # of other cache settings
    add_peer_source(message, target, candidates)
    assert (message.peer_source.instance_id, message.peer_source.num_blocks,
            message.peer_source.num_local_blocks) == ("d1", 6, 3)
    add_peer_source(message, replace(target, prefix_blocks=6), candidates)
    assert not message.HasField("peer_source")  # nobody holds more than it does itself
