"""The planner's pure logic on hand-made observations: exact replica counts per pool, pools
sized separately, no flapping inside the hysteresis band, cooldowns and patience respected.

The profile is made by hand: prefill costs 1 ms a token (a 256-token prompt 0.256 s), a decode
step 20 ms + 1 ms per sequence (so 80 sequences fit a 100 ms ITL SLO)."""

import dataclasses

import pytest

from services.planner import sizing
from services.planner.config import PlannerConfig, PoolBounds
from services.planner.observation import Observation
from services.planner.planner import Planner
from services.cost_model.perf_profile import PerfProfile
from shared.errors import ConfigurationError

PROFILE = PerfProfile(model="m", dtype="bfloat16", num_threads=2, block_size=16, kv_capacity_tokens=100_000,
                      prefill=[], decode=[], prefill_fit=[0.0, 0.001, 0.0], decode_fit=[0.02, 0.001, 0.0])
CONFIG = PlannerConfig(ttft_slo_s=1.0, itl_slo_s=0.1, prefill=PoolBounds(1, 8), decode=PoolBounds(1, 8),
                       interval_s=10.0, max_prefill_utilization=0.8, scale_in_margin=0.25, scale_in_patience=3,
                       scale_out_cooldown_s=20.0, scale_in_cooldown_s=60.0)


def load(rate: float, prompt: float = 256, output: float = 128, **levels) -> Observation:
    return Observation(request_rate=rate, mean_prompt_tokens=prompt, mean_output_tokens=output, **levels)


def prefill(rate, prompt=256.0, queue=0, slo=1.0):
    return sizing.prefill_need(PROFILE, rate, prompt, 0.0, queue, slo, 10.0, 0.8).replicas


def decode(rate, output=128.0, observed=0, profile=PROFILE):
    return sizing.decode_need(profile, rate, 256.0, output, observed, 0.1, 128).replicas


def test_prefill_need_is_throughput_at_the_ttft_slo():
    assert [prefill(rate) for rate in (0, 1, 5, 10)] == [0, 1, 2, 4]  # 0.256 s/prompt at <= 80% busy
    assert prefill(0, queue=20) == 1  # a backlog of 20 prompts drained within one interval
    assert prefill(1, prompt=2048, slo=3.0) == 5  # 2.048 s/prompt: M/D/1 caps utilization at 48%


def test_prefill_need_when_the_slo_is_below_one_prompt():
    need = sizing.prefill_need(PROFILE, 10, 256, 0.0, 0, 0.2, 10.0, 0.8)
    assert need.replicas == 4 and "below one prefill" in need.reason


def test_the_request_path_overhead_comes_out_of_the_ttft_budget():
    # 2.048 s prompts under a 3 s SLO: 48% busy at most; with 0.5 s of the SLO spent on the
    # request's path only 0.45 s of queueing is left: 5 -> 7 instances (M/D/1 at 31%).
    slow_path = dataclasses.replace(PROFILE, request_overhead_s=0.5)
    assert sizing.prefill_need(slow_path, 1, 2048, 0.0, 0, 3.0, 10.0, 0.8).replicas == 7


def test_prefill_need_counts_only_uncached_tokens():
    assert sizing.prefill_need(PROFILE, 10, 256, 0.5, 0, 1.0, 10.0, 0.8).replicas == 2


def test_decode_need_is_batch_capacity_at_the_itl_slo():
    assert [decode(rate) for rate in (0, 5, 10, 20)] == [0, 1, 2, 4]  # 12.8 sequences in flight per req/s
    assert decode(0, observed=200) == 3  # observed sequences count when larger than the forecast
    small_kv = PerfProfile(**{**PROFILE.__dict__, "kv_capacity_tokens": 3840})  # 10 sequences of 384 tokens
    assert sizing.decode_batch_within(small_kv, 0.1, 320, 384, 128) == 10
    assert decode(5, profile=small_kv) == 2  # 5 * 128 * 0.03 = 19.2 sequences / 10


def test_pools_are_sized_separately():
    planner = Planner(CONFIG, PROFILE, num_prefill=1, num_decode=1)
    decision = planner.plan(load(10), now=0.0)
    assert (decision.prefill.desired, decision.decode.desired) == (4, 2)
    long_prompts = Planner(PlannerConfig(**{**CONFIG.__dict__, "ttft_slo_s": 3.0}), PROFILE, 1, 1)
    decision = long_prompts.plan(load(1, prompt=2048, output=16), now=0.0)
    assert (decision.prefill.desired, decision.decode.desired) == (5, 1)
    assert decision.prefill.action == "scale_out" and decision.decode.action == "hold"


def test_bounds_clamp_the_need():
    planner = Planner(CONFIG, PROFILE, num_prefill=1, num_decode=1)
    decision = planner.plan(load(40), now=0.0)  # needs 13 prefill, 7 decode
    assert (decision.prefill.needed, decision.prefill.desired) == (13, 8)
    assert (decision.decode.needed, decision.decode.desired) == (7, 7)


def test_no_flapping_inside_the_hysteresis_band():
    planner = Planner(CONFIG, PROFILE, num_prefill=1, num_decode=1)
    rates = [10, 9, 11, 9, 11, 9, 10, 9, 11, 9, 10, 9]
    desired = [planner.plan(load(rate), now=10.0 * i).prefill.desired for i, rate in enumerate(rates)]
    assert desired == [4] * len(rates)


def test_scale_out_waits_for_its_cooldown():
    planner = Planner(CONFIG, PROFILE, num_prefill=1, num_decode=1)
    assert planner.plan(load(10), now=0.0).prefill.desired == 4
    held = planner.plan(load(20), now=10.0).prefill
    assert (held.desired, held.action) == (4, "hold") and "cooldown" in held.reason
    # Holt's forecast is still catching up with the step (10, 20, 20 -> 20.3 req/s): 7, not 8.
    assert planner.plan(load(20), now=20.0).prefill.desired == 7


def test_scale_in_needs_patience_cooldown_and_goes_one_step_at_a_time():
    planner = Planner(CONFIG, PROFILE, num_prefill=1, num_decode=1)
    assert planner.plan(load(10), now=0.0).prefill.desired == 4
    timeline = {t: planner.plan(load(0), now=t).prefill for t in range(10, 130, 10)}
    assert [timeline[t].desired for t in range(10, 130, 10)] == [4, 4, 4, 4, 4, 3, 3, 3, 3, 3, 3, 2]
    assert "pending (1/3)" in timeline[10].reason and "cooldown" in timeline[30].reason
    assert timeline[60].action == "scale_in" and timeline[120].action == "scale_in"


def test_decision_log_line_names_inputs_and_reasons():
    planner = Planner(CONFIG, PROFILE, num_prefill=1, num_decode=1)
    line = planner.plan(load(10, prefill_queue_depth=3), now=0.0).log_line()
    assert '"prefill_queue_depth": 3' in line and '"action": "scale_out"' in line and "ms/prompt" in line


def test_bad_bounds_are_refused():
    with pytest.raises(ConfigurationError, match="prefill bounds"):
        PlannerConfig(prefill=PoolBounds(3, 2))
