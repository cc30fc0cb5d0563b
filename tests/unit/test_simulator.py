"""The cluster simulator on a hand-made profile with deterministic seeds: traces are
reproducible, an idle cluster gives the profile's own latencies exactly, queueing shows up
when a pool is too small, and the ratio search and planner comparison answer."""

import pytest

from services.planner.config import PlannerConfig, PoolBounds
from services.simulator.cluster import SimConfig
from services.simulator.search import least_cost_ratio, simulate_fixed, simulate_planner
from services.simulator.workload import LengthModel, SimRequest, diurnal_rate, make_trace
from tests.unit.test_planner_logic import PROFILE

FIXED_LENGTHS = LengthModel(prompt_median=256, output_median=128, sigma=0.0, prefix_share=0.0)
CONFIG = SimConfig(ttft_slo_s=1.0, itl_slo_s=0.1, kv_bandwidth_bytes_s=1e9, kv_bytes_per_token=1000,
                   kv_transfer_latency_s=0.0, startup_s=5.0, interval_s=10.0)


def test_traces_are_deterministic_per_seed():
    first = make_trace("poisson", 5.0, 60.0, LengthModel(), seed=3)
    assert first == make_trace("poisson", 5.0, 60.0, LengthModel(), seed=3)
    assert first != make_trace("poisson", 5.0, 60.0, LengthModel(), seed=4)
    assert 240 < len(first) < 360
    assert {r.prefix_tokens for r in first if r.prefix_id is not None} == {128}


def test_diurnal_curve_peaks_in_the_afternoon():
    rate = diurnal_rate(100.0)
    assert rate(4 * 3600) == pytest.approx(15.0) and rate(16 * 3600) == pytest.approx(100.0)
    bursty = make_trace("bursty", 2.0, 600.0, FIXED_LENGTHS, seed=0)
    in_bursts = sum(1 for r in bursty if r.arrival_s % 60 < 10)
    assert in_bursts > len(bursty) / 3  # 1/6 of the time carries 4/9 of the load


def test_a_lone_request_sees_the_profile_costs_exactly():
    request = SimRequest(0, 0.0, 256, 11, None, 0)
    summary = simulate_fixed(PROFILE, CONFIG, [request], 1, 1)
    assert summary.ttft_p50_s == pytest.approx(0.256 + 256 * 1000 / 1e9)
    assert summary.tpot_p50_s == pytest.approx(0.021)  # 20 ms + 1 ms per sequence, batch 1
    assert summary.slo_attainment == 1.0 and summary.num_completed == 1


def test_prefix_hits_make_prefill_cheaper():
    shared = [SimRequest(i, 10.0 * i, 256, 2, 7, 128) for i in range(2)]
    summary = simulate_fixed(PROFILE, CONFIG, shared, 1, 1)
    assert summary.ttft_p50_s == pytest.approx((0.256 + 0.128) / 2 + 256e-6)


def test_too_few_prefill_instances_queue_prompts():
    requests = make_trace("poisson", 6.0, 120.0, FIXED_LENGTHS, seed=1)  # 6 x 0.256 s = 1.5 instances busy
    starved, enough = (simulate_fixed(PROFILE, CONFIG, requests, p, 2) for p in (1, 3))
    assert starved.ttft_p90_s > 10 * enough.ttft_p90_s and enough.ttft_attainment > 0.95
    assert starved.prefill_instance_hours < enough.prefill_instance_hours


def test_least_cost_ratio_meets_the_target():
    requests = make_trace("poisson", 10.0, 60.0, FIXED_LENGTHS, seed=2)
    result = least_cost_ratio(PROFILE, CONFIG, requests, target=0.9, max_per_pool=16)
    assert result.summary.slo_attainment >= 0.9
    fewer = [simulate_fixed(PROFILE, CONFIG, requests, result.num_prefill - 1, result.num_decode),
             simulate_fixed(PROFILE, CONFIG, requests, result.num_prefill, result.num_decode - 1)]
    assert all(summary.slo_attainment < 0.9 for summary in fewer)


def test_planner_follows_a_ramp_and_returns():
    requests = [r for r in make_trace("diurnal", 12.0, 1200.0, FIXED_LENGTHS, seed=5, day_s=1200.0)]
    planner_config = PlannerConfig(ttft_slo_s=1.0, itl_slo_s=0.1, prefill=PoolBounds(1, 8), decode=PoolBounds(1, 8),
                                   interval_s=10.0, scale_out_cooldown_s=10.0, scale_in_cooldown_s=30.0)
    summary, timeline = simulate_planner(PROFILE, CONFIG, planner_config, requests)
    prefill_sizes = [p for _, p, _, _ in timeline]
    assert max(prefill_sizes) >= 3 and prefill_sizes[-1] <= 2 and summary.scale_events >= 4
    assert summary.num_completed == summary.num_requests


def test_simulate_command_writes_results(tmp_path, capsys):
    from services.cli.main import main

    PROFILE.save(tmp_path / "profile.json")
    common = ["simulate", "--profile", str(tmp_path / "profile.json"), "--rate", "4", "--duration", "60",
              "--ttft-slo", "1", "--itl-slo", "0.1", "--max-per-pool", "8"]
    assert main([*common, "--fixed", "2:1", "--json", str(tmp_path / "fixed.json")]) == 0
    assert "fixed 2P:1D" in capsys.readouterr().out
    assert main([*common, "--json", str(tmp_path / "compare.json")]) == 0
    out = capsys.readouterr().out
    assert "least-cost fixed" in out and "planner" in out
    import json
    results = json.loads((tmp_path / "compare.json").read_text())
    assert results["least_cost_fixed"]["slo_attainment"] >= 0.9 and results["planner"]["num_completed"] > 0
