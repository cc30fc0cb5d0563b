"""The continuous-batching scheduler, driven with hand-made model outputs (no model).

Block size 4 throughout, so block ids and counts are easy to read.
"""

import pytest

from shared.core.kv_cache_manager import KVCacheManager
from shared.core.request import Request, RequestStatus
from shared.core.scheduler import Scheduler
from shared.core.scheduler_config import SchedulerConfig
from shared.kv_cache.block_pool import BlockPool
from shared.sampling.params import SamplingParams

BLOCK_SIZE = 4
EOS = 0


def make_scheduler(num_blocks=16, max_num_batched_tokens=64, max_num_seqs=8, prefix_caching=True,
                   chunked=True, long_prefill_token_threshold=0, max_num_partial_prefills=4) -> Scheduler:
    kv = KVCacheManager(BlockPool(num_blocks), BLOCK_SIZE, prefix_caching)
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                             enable_chunked_prefill=chunked, long_prefill_token_threshold=long_prefill_token_threshold,
                             max_num_partial_prefills=max_num_partial_prefills)
    return Scheduler(config, kv, max_model_len=1024)


def make_request(request_id, prompt, max_tokens=4, arrival=None, **params) -> Request:
    request = Request(request_id, list(prompt), SamplingParams(max_tokens=max_tokens, **params),
                      eos_token_ids=(EOS,), max_output_tokens=max_tokens)
    if arrival is not None:
        request.arrival_time = arrival
    return request


def run_step(scheduler, token=7):
    """One step with the model 'sampling' `token` for every request that samples."""
    output = scheduler.schedule()
    sampled = {item.request_id: token for item in output.scheduled if item.sampling_params is not None}
    scheduler.update_from_output(output, sampled)
    return output


def assert_all_blocks_free(scheduler):
    pool = scheduler.kv.pool
    assert pool.num_free_blocks == pool.num_blocks
    assert all(block.ref_count == 0 for block in pool.blocks)


def test_fresh_prompt_gets_blocks_in_order_and_samples_at_its_last_token():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", range(1, 10)))
    output = run_step(scheduler)
    [item] = output.scheduled
    assert item.token_ids == list(range(1, 10)) and item.start_position == 0
    assert item.block_ids == [0, 1, 2]
    assert item.sampling_params is not None
    request = scheduler.requests["a"]
    assert request.num_computed_tokens == 9 and request.output_token_ids == [7]


def test_decodes_come_first_then_prompt_work_within_the_token_budget():
    scheduler = make_scheduler(max_num_batched_tokens=10)
    scheduler.add_request(make_request("old", [1, 2, 3]))
    run_step(scheduler)
    scheduler.add_request(make_request("new", range(1, 21)))
    output = run_step(scheduler)
    assert [(i.request_id, i.num_tokens) for i in output.scheduled] == [("old", 1), ("new", 9)]
    assert output.num_batched_tokens == 10
    assert output.scheduled[1].sampling_params is None  # a chunk: nothing sampled yet
    output = run_step(scheduler)
    assert [(i.request_id, i.num_tokens, i.start_position) for i in output.scheduled] == [("old", 1, 4), ("new", 9, 9)]


def test_chunked_prefill_catches_up_and_samples_only_at_the_end():
    scheduler = make_scheduler(max_num_batched_tokens=4)
    scheduler.add_request(make_request("a", range(1, 11), max_tokens=2))
    chunks = [run_step(scheduler).scheduled[0] for _ in range(3)]
    assert [(c.start_position, c.num_tokens) for c in chunks] == [(0, 4), (4, 4), (8, 2)]
    assert [c.sampling_params is not None for c in chunks] == [False, False, True]
    run_step(scheduler)
    assert "a" not in scheduler.requests
    assert_all_blocks_free(scheduler)


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room():
    scheduler = make_scheduler(max_num_batched_tokens=8, chunked=False)
    scheduler.add_request(make_request("a", range(1, 6)))
    scheduler.add_request(make_request("b", range(1, 6)))
    output = run_step(scheduler)
    assert [i.request_id for i in output.scheduled] == ["a"]


def test_long_prefill_threshold_lets_several_prompts_share_a_step():
    scheduler = make_scheduler(max_num_batched_tokens=16, long_prefill_token_threshold=6)
    scheduler.add_request(make_request("a", range(1, 21)))
    scheduler.add_request(make_request("b", range(1, 21)))
    output = run_step(scheduler)
    assert [(i.request_id, i.num_tokens) for i in output.scheduled] == [("a", 6), ("b", 6)]


def test_max_num_seqs_bounds_the_running_set():
    scheduler = make_scheduler(max_num_seqs=2)
    for name in "abc":
        scheduler.add_request(make_request(name, [1, 2]))
    output = run_step(scheduler)
    assert [i.request_id for i in output.scheduled] == ["a", "b"]
    assert [r.request_id for r in scheduler.waiting] == ["c"]


def test_finishes_on_eos_stop_token_and_max_tokens_and_frees_blocks():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("eos", [1, 2]))
    scheduler.add_request(make_request("stop", [1, 2], stop_token_ids=[5]))
    scheduler.add_request(make_request("len", [1, 2], max_tokens=1))
    output = scheduler.schedule()
    scheduler.update_from_output(output, {"eos": EOS, "stop": 5, "len": 9})
    assert scheduler.requests == {}
    assert_all_blocks_free(scheduler)
    assert scheduler.schedule().finished_request_ids == {"eos", "stop", "len"}


def test_ignore_eos_and_min_tokens_keep_generating():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", [1, 2], max_tokens=3, ignore_eos=True))
    scheduler.add_request(make_request("b", [1, 2], max_tokens=3, min_tokens=2))
    run_step(scheduler, token=EOS)
    assert set(scheduler.requests) == {"a", "b"}
    output = run_step(scheduler, token=EOS)
    assert set(scheduler.requests) == {"a"}
    assert output.scheduled[0].stop_and_eos_token_ids == ()  # a ignores EOS: nothing suppressed


def test_min_tokens_suppresses_eos_and_stop_ids_until_reached():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", [1, 2], max_tokens=5, min_tokens=2, stop_token_ids=[9]))
    first = run_step(scheduler)
    assert first.scheduled[0].stop_and_eos_token_ids == (EOS, 9)
    run_step(scheduler)
    assert run_step(scheduler).scheduled[0].stop_and_eos_token_ids == ()


def test_abort_frees_blocks_at_once_and_is_reported_to_workers():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", range(1, 10)))
    scheduler.add_request(make_request("b", range(1, 10)))
    run_step(scheduler)
    scheduler.abort(["a", "b", "unknown"])
    assert_all_blocks_free(scheduler)
    assert scheduler.schedule().finished_request_ids == {"a", "b"}


def test_preemption_takes_the_newest_request_and_it_later_recomputes():
    scheduler = make_scheduler(num_blocks=4, prefix_caching=False)
    scheduler.add_request(make_request("old", range(1, 8), max_tokens=6, arrival=1.0))   # 7 tokens: 2 blocks
    scheduler.add_request(make_request("new", range(1, 8), max_tokens=6, arrival=2.0))
    run_step(scheduler)  # both prefilled: 7 computed + 1 sampled each, all 4 blocks used
    run_step(scheduler)  # position 7 still fits in each request's second block
    output = run_step(scheduler)  # position 8 needs a third block each: "new" is preempted
    assert output.preempted_request_ids == ["new"]
    assert [i.request_id for i in output.scheduled] == ["old"]
    new = scheduler.waiting[0]
    assert new.status == RequestStatus.PREEMPTED and new.num_computed_tokens == 0
    assert new.output_token_ids == [7, 7]  # generated tokens are kept and recomputed
    while scheduler.num_unfinished:
        out = run_step(scheduler)
        recompute = [i for i in out.scheduled if i.request_id == "new" and i.start_position == 0]
        if recompute:
            assert recompute[0].token_ids == list(range(1, 8)) + [7, 7]
    assert_all_blocks_free(scheduler)


def test_a_request_too_new_to_fit_preempts_itself_not_an_older_one():
    scheduler = make_scheduler(num_blocks=3, prefix_caching=False)
    scheduler.add_request(make_request("old", range(1, 8), max_tokens=6, arrival=1.0))  # 2 blocks
    scheduler.add_request(make_request("new", [1, 2, 3], max_tokens=6, arrival=2.0))   # 1 block
    run_step(scheduler)
    run_step(scheduler)
    output = run_step(scheduler)  # old's position 8 needs a 3rd block: new (newest) goes
    assert output.preempted_request_ids == ["new"]
    assert scheduler.requests["old"].status == RequestStatus.RUNNING


def test_prefix_hit_reuses_cached_blocks_and_computes_only_the_rest():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", range(1, 11), max_tokens=1))
    run_step(scheduler)
    assert_all_blocks_free(scheduler)  # finished; its 2 full blocks stay cached
    scheduler.add_request(make_request("b", list(range(1, 11)) + [50, 51], max_tokens=1))
    [item] = run_step(scheduler).scheduled
    assert item.start_position == 8 and item.token_ids == [9, 10, 50, 51]
    assert item.block_ids[:2] == [0, 1]  # a's blocks, revived from the free queue


def test_prefix_hit_never_covers_the_last_token():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", range(1, 9), max_tokens=1))
    run_step(scheduler)
    scheduler.add_request(make_request("b", range(1, 9), max_tokens=1))
    [item] = run_step(scheduler).scheduled
    assert item.start_position == 4 and item.token_ids == [5, 6, 7, 8]


def test_prefix_caching_off_computes_everything():
    scheduler = make_scheduler(prefix_caching=False)
    scheduler.add_request(make_request("a", range(1, 11), max_tokens=1))
    run_step(scheduler)
    scheduler.add_request(make_request("b", range(1, 11), max_tokens=1))
    assert run_step(scheduler).scheduled[0].start_position == 0


def test_eviction_frees_the_tail_of_a_sequence_before_its_prefix():
    scheduler = make_scheduler(num_blocks=4)
    scheduler.add_request(make_request("a", range(1, 13), max_tokens=1))  # 3 full blocks cached
    run_step(scheduler)
    assert scheduler.kv.pool.free_block_ids() == [3, 2, 1, 0]


def test_n_siblings_share_the_parents_computed_prompt_blocks():
    scheduler = make_scheduler(prefix_caching=False)
    parent = make_request("p#0", range(1, 11), max_tokens=3)
    child = make_request("p#1", range(1, 11), max_tokens=3)
    child.prompt_parent = parent
    scheduler.add_request(parent)
    scheduler.add_request(child)
    first = run_step(scheduler)
    assert [i.request_id for i in first.scheduled] == ["p#0"]  # the child waits for the prompt
    second = run_step(scheduler)
    child_item = next(i for i in second.scheduled if i.request_id == "p#1")
    assert child_item.start_position == 8 and child_item.token_ids == [9, 10]
    assert child_item.block_ids[:2] == parent_block_ids(first)[:2]
    assert scheduler.kv.pool.blocks[0].ref_count == 2
    while scheduler.num_unfinished:
        run_step(scheduler)
    assert_all_blocks_free(scheduler)


def parent_block_ids(output):
    return output.scheduled[0].block_ids


def test_prompt_logprob_targets_are_the_next_prompt_tokens_per_chunk():
    scheduler = make_scheduler(max_num_batched_tokens=4)
    scheduler.add_request(make_request("a", [10, 11, 12, 13, 14, 15], prompt_logprobs=1))
    first = run_step(scheduler).scheduled[0]
    second = run_step(scheduler).scheduled[0]
    assert first.prompt_logprob_targets == [11, 12, 13, 14]
    assert second.prompt_logprob_targets == [15]


# ---- fair prefill: prompts share what the decodes leave of the budget -------------------------

def test_a_short_prompt_arriving_behind_a_long_one_is_computed_in_the_next_step():
    scheduler = make_scheduler(num_blocks=64, max_num_batched_tokens=16)
    scheduler.add_request(make_request("long", range(1, 101)))
    assert [(i.request_id, i.num_tokens) for i in run_step(scheduler).scheduled] == [("long", 16)]
    scheduler.add_request(make_request("short", [5, 6, 7]))
    output = run_step(scheduler)
    assert [(i.request_id, i.start_position, i.num_tokens) for i in output.scheduled] == [
        ("long", 16, 8), ("short", 0, 3)]
    assert output.scheduled[1].sampling_params is not None  # its first token comes out now
    output = run_step(scheduler)  # "short" decodes first; "long" alone takes the rest
    assert [(i.request_id, i.num_tokens) for i in output.scheduled] == [("short", 1), ("long", 15)]


def test_decodes_come_first_and_prompts_share_the_rest_in_arrival_order():
    scheduler = make_scheduler(num_blocks=64, max_num_batched_tokens=16)
    scheduler.add_request(make_request("decoding", [1, 2, 3]))
    run_step(scheduler)
    for name in ("a", "b", "c"):
        scheduler.add_request(make_request(name, range(1, 21)))
    output = run_step(scheduler)
    # 15 tokens left for 3 prompts: 5 each, never under one block (4).
    assert [(i.request_id, i.num_tokens) for i in output.scheduled] == [("decoding", 1), ("a", 5), ("b", 5), ("c", 5)]


def test_the_share_never_falls_under_one_block():
    scheduler = make_scheduler(num_blocks=64, max_num_batched_tokens=8, max_num_seqs=8)
    for name in "abcd":
        scheduler.add_request(make_request(name, range(1, 13)))
    output = run_step(scheduler)
    assert [(i.request_id, i.num_tokens) for i in output.scheduled] == [("a", 4), ("b", 4)]


def test_a_prompt_alone_takes_the_whole_budget_and_waiting_without_a_slot_does_not_count():
    scheduler = make_scheduler(num_blocks=64, max_num_batched_tokens=16, max_num_seqs=1)
    scheduler.add_request(make_request("long", range(1, 41)))
    scheduler.add_request(make_request("no_slot", [1, 2]))
    assert [(i.request_id, i.num_tokens) for i in run_step(scheduler).scheduled] == [("long", 16)]
    assert [(i.request_id, i.num_tokens) for i in run_step(scheduler).scheduled] == [("long", 16)]


def scheduled_tokens(output) -> dict[str, int]:
    return {item.request_id: item.num_tokens for item in output.scheduled}


def test_a_short_arrival_gets_in_beside_as_many_long_prompts_as_may_share_a_step():
    scheduler = make_scheduler(num_blocks=64, max_num_batched_tokens=16, max_num_partial_prefills=4)
    for name in "abcd":
        scheduler.add_request(make_request(name, range(1, 41)))
    assert scheduled_tokens(run_step(scheduler)) == {"a": 4, "b": 4, "c": 4, "d": 4}
    scheduler.add_request(make_request("short", [5, 6, 7]))
    # Room is held back for all of "short", so the youngest long prompt gets only what is left...
    assert scheduled_tokens(run_step(scheduler)) == {"a": 4, "b": 4, "c": 4, "d": 1, "short": 3}
    # ...and "short" decodes from the next step on while the long ones go on, oldest first.
    assert scheduled_tokens(run_step(scheduler)) == {"short": 1, "a": 4, "b": 4, "c": 4, "d": 3}


def first_token_steps(scheduler, num_steps: int) -> dict[str, int]:
    steps = {}
    for step in range(1, num_steps + 1):
        for item in run_step(scheduler).scheduled:
            if item.sampling_params is not None:
                steps.setdefault(item.request_id, step)
    return steps


def test_a_burst_shares_steps_among_the_first_arrivals_so_first_tokens_come_out_in_groups():
    scheduler = make_scheduler(num_blocks=64, max_num_batched_tokens=16, max_num_partial_prefills=2)
    for offset, name in enumerate("abcd"):
        scheduler.add_request(make_request(name, range(100 * offset + 1, 100 * offset + 13)))
    # Two prompts share each step (8 tokens each); the rest wait their turn instead of
    # slowing every prompt down so that all four first tokens come out at step 3.
    assert first_token_steps(scheduler, 4) == {"a": 2, "b": 2, "c": 3, "d": 4}


def test_a_long_arrival_waits_while_as_many_long_prompts_as_may_share_a_step_go_on():
    scheduler = make_scheduler(num_blocks=64, max_num_batched_tokens=16, max_num_partial_prefills=2)
    for offset, name in enumerate("abc"):
        scheduler.add_request(make_request(name, range(100 * offset + 1, 100 * offset + 41)))
    assert scheduled_tokens(run_step(scheduler)) == {"a": 8, "b": 8}
    assert scheduled_tokens(run_step(scheduler)) == {"a": 8, "b": 8}
