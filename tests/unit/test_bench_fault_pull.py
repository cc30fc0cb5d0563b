"""The pure parts of `make bench-faults`'s holder-killed-mid-pull scenario: the chats' next
turns, reading the peer-pull counters from /metrics text, choosing the pull to kill, and the
verdict on it."""

import pytest

from benchmarks.fault_chat_load import next_turn_prompt
from benchmarks.fault_pull import PullKill, metric_sum, pick_pull
from benchmarks.faults import pull_verdict

METRICS = """# HELP pdserve:kv_peer_sends Prefixes this instance sent to peers that pulled them.
# TYPE pdserve:kv_peer_sends counter
pdserve:kv_peer_sends_total 3.0
pdserve:kv_peer_pulls_in_flight 1.0
pdserve:kv_tier_loads_total{tier="host"} 12.0
pdserve:kv_tier_loads_total{tier="peer"} 7.0
pdserve:kv_tier_loads_created{tier="peer"} 1.7e9
"""


def test_the_next_turn_is_the_whole_chat_so_far_then_a_new_message():
    prompt, answer = [5, 6, 7], [8, 9]
    turn = next_turn_prompt(prompt, answer, 4, seed=1)
    assert turn[:5] == [5, 6, 7, 8, 9]
    assert len(turn) == 9
    assert turn == next_turn_prompt(prompt, answer, 4, seed=1)  # reproducible
    assert turn[5:] != next_turn_prompt(prompt, answer, 4, seed=2)[5:]


def test_a_next_turn_needs_a_new_message():
    with pytest.raises(ValueError, match="num_new_tokens"):
        next_turn_prompt([1], [2], 0, seed=1)


def test_metric_sum_reads_counters_gauges_and_labels():
    assert metric_sum(METRICS, "pdserve:kv_peer_sends") == 3
    assert metric_sum(METRICS, "pdserve:kv_peer_pulls_in_flight") == 1
    assert metric_sum(METRICS, "pdserve:kv_tier_loads", tier="peer") == 7
    assert metric_sum(METRICS, "pdserve:kv_tier_loads") == 19  # every tier; never the _created sample
    assert metric_sum(METRICS, "pdserve:kv_peer_send_blocks") == 0


def test_the_probe_pulls_what_the_victim_holds_beyond_a_prefill_instance():
    held = [{"decode-0": 20, "prefill-0": 18, "prefill-1": 0},
            {"decode-0": 22, "prefill-0": 22, "prefill-1": 5},
            {"decode-0": 0, "prefill-0": 0, "prefill-1": 0}]
    assert pick_pull(held, "decode-0", ["prefill-0", "prefill-1"]) == (0, "prefill-1", 0)


def test_no_probe_when_every_prefill_instance_holds_what_the_victim_holds():
    held = [{"decode-0": 4, "prefill-0": 4, "prefill-1": 6}]
    assert pick_pull(held, "decode-0", ["prefill-0", "prefill-1"]) is None


def test_the_verdict_on_the_killed_pull_is_exact_only_in_fp32():
    assert pull_verdict(PullKill("decode-0", True, True, True, 0), "float32") == "yes"
    assert pull_verdict(PullKill("decode-0", True, True, False, 0), "float32") == "NO"
    assert pull_verdict(PullKill("decode-0", True, True, False, 0), "bfloat16").startswith("tokens differ")
    assert pull_verdict(PullKill("decode-0", False, True, True, 0), "float32") == "NO"  # no pull was hit
    assert pull_verdict(PullKill("decode-0", True, False, True, 0), "bfloat16") == "NO"  # the request failed
