"""The scheduler with speculation (no model): proposal slots, caps, confirmed-only caching.

Block size 4. Verification results are hand-made `VerifiedTokens`.
"""

from shared.core.kv_cache_manager import KVCacheManager
from shared.core.request import Request
from shared.core.scheduler import Scheduler
from shared.core.scheduler_config import SchedulerConfig
from shared.core.verified_tokens import VerifiedTokens
from shared.kv_cache.block_pool import BlockPool
from shared.sampling.params import SamplingParams

EOS = 0


def make_scheduler(num_blocks=16, k=3, max_num_batched_tokens=64) -> Scheduler:
    kv = KVCacheManager(BlockPool(num_blocks), 4, enable_prefix_caching=True)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens), kv, 1024, num_spec_tokens=k)


def add(scheduler, request_id, prompt, max_tokens=10, **params) -> Request:
    request = Request(request_id, list(prompt), SamplingParams(max_tokens=max_tokens, **params),
                      eos_token_ids=(EOS,), max_output_tokens=max_tokens)
    scheduler.add_request(request)
    return request


def prefill(scheduler, token=7):
    output = scheduler.schedule()
    scheduler.update_from_output(output, {item.request_id: token for item in output.scheduled})
    return output


def test_a_decode_gets_k_proposal_slots_after_its_prompt():
    scheduler = make_scheduler()
    request = add(scheduler, "a", range(1, 7))
    assert prefill(scheduler).scheduled[0].num_spec_tokens == 0
    [item] = scheduler.schedule().scheduled
    assert (item.token_ids, item.start_position, item.num_spec_tokens) == ([7], 6, 3)
    # Slots for positions 6..9: the last token plus three proposals.
    assert len(item.block_ids) == 3 and scheduler.kv.num_blocks_held("a") == 3
    assert request.num_computed_tokens == 6


def test_accepted_tokens_advance_the_request_and_rejected_slots_stay_uncomputed():
    scheduler = make_scheduler()
    request = add(scheduler, "a", range(1, 7))
    prefill(scheduler)
    output = scheduler.schedule()
    # One of three proposals accepted, then the recovered token.
    updated = scheduler.update_from_output(output, {}, {"a": VerifiedTokens([21, 22], 3, 8)})
    assert updated == [request]
    assert request.output_token_ids == [7, 21, 22]
    assert request.num_computed_tokens == 8 and request.num_draft_computed_tokens == 8
    # Only the block of confirmed, computed positions 0..3 and 4..7 is hashed.
    assert scheduler.kv.pool.num_cached_blocks == 2
    [item] = scheduler.schedule().scheduled
    assert (item.token_ids, item.start_position, item.num_draft_computed_tokens) == ([22], 8, 8)


def test_proposals_never_reach_past_max_tokens():
    scheduler = make_scheduler(k=5)
    request = add(scheduler, "a", [1, 2, 3], max_tokens=4)
    prefill(scheduler)
    output = scheduler.schedule()
    assert output.scheduled[0].num_spec_tokens == 2  # 1 output + 2 proposals + 1 bonus = max_tokens
    scheduler.update_from_output(output, {}, {"a": VerifiedTokens([4, 5, 6], 2)})
    assert request.output_token_ids == [7, 4, 5, 6] and request.status.finish_reason == "length"
    assert scheduler.kv.pool.num_free_blocks == 16


def test_a_stop_token_drops_the_rest_of_the_accepted_tokens():
    scheduler = make_scheduler()
    request = add(scheduler, "a", [1, 2, 3], stop_token_ids=[30])
    prefill(scheduler)
    output = scheduler.schedule()
    scheduler.update_from_output(output, {}, {"a": VerifiedTokens([4, 30, 5, 6], 3)})
    assert request.output_token_ids == [7, 4, 30]
    assert (request.status.finish_reason, request.stop_reason) == ("stop", 30)
    assert scheduler.kv.pool.num_free_blocks == 16


def test_opted_out_logprobs_and_budget_limited_requests_decode_one_token():
    scheduler = make_scheduler(max_num_batched_tokens=5)
    add(scheduler, "off", [1], use_speculation=False)
    add(scheduler, "lp", [3], logprobs=1)
    add(scheduler, "on", [5])
    prefill(scheduler)
    spec = {item.request_id: item.num_spec_tokens for item in scheduler.schedule().scheduled}
    # Budget 5: two single-token decodes, then 1 + 2 proposals for "on".
    assert spec == {"off": 0, "lp": 0, "on": 2}


def test_no_room_for_proposals_means_a_plain_decode_not_a_preemption():
    scheduler = make_scheduler(num_blocks=2)
    add(scheduler, "a", [1, 2, 3, 4, 5, 6])
    prefill(scheduler)
    [item] = scheduler.schedule().scheduled
    assert item.num_spec_tokens == 0 and scheduler.num_preemptions == 0


def test_proposal_slots_never_take_the_blocks_another_decode_needs():
    """4 blocks; after their prompts a and b hold one each. a's 5 proposals would need two
    more, leaving none for b's next token: a decodes one token instead, nobody is preempted."""
    scheduler = make_scheduler(num_blocks=4, k=5)
    add(scheduler, "a", [1, 2, 3, 4])
    add(scheduler, "b", [5, 6, 7, 8])
    prefill(scheduler)
    spec = {item.request_id: item.num_spec_tokens for item in scheduler.schedule().scheduled}
    assert spec == {"a": 0, "b": 0} and scheduler.num_preemptions == 0
