"""The simulator's cost models and search, on hand-made profiles: the shared-host CPU model
(processor sharing, exact finish times), the KV transfer time taken from the profile, and the
least-cost P:D search against a brute force over every (P, D) of a small case."""

import dataclasses
import math

import pytest

from services.cost_model.perf_profile import TransferPoint
from services.simulator.cluster import ClusterSim, SimConfig
from services.simulator.host import SharedHost
from services.simulator.scalers import FixedScaler
from services.simulator.search import least_cost_ratio, simulate_fixed
from services.simulator.workload import LengthModel, SimRequest, make_trace
from tests.unit.test_planner_logic import PROFILE

CONFIG = SimConfig(ttft_slo_s=1.0, itl_slo_s=0.1, kv_bandwidth_bytes_s=1e9, kv_bytes_per_token=1000,
                   kv_transfer_latency_s=0.0, startup_s=5.0, interval_s=10.0)
SHARED = dataclasses.replace(CONFIG, host_cores=1, colocated_slowdown=1.0)
WITH_TRANSFER = dataclasses.replace(PROFILE, transfer=[TransferPoint(0, 0.01), TransferPoint(1000, 0.11)],
                                    transfer_fit=[])


def finishes(updates) -> dict[int, float]:
    return {job_id: pytest.approx(at) for job_id, at, _ in updates}


def test_shared_host_processor_sharing():
    host = SharedHost(cores=1, colocated_slowdown=1.0)
    assert finishes(host.start(0.0, 1, 1.0)) == {1: 1.0}
    # a second job at 0.5: both at half speed; job 1 has 0.5 s left -> ends at 1.5
    assert finishes(host.start(0.5, 2, 1.0)) == {1: 1.5, 2: 2.5}
    # job 1 ends; job 2 did 0.5 s of work, its last 0.5 s runs alone
    assert finishes(host.finish(1.5, 1)) == {2: 2.0}
    assert host.num_running == 1


def test_shared_host_slowdown_beyond_and_within_cores():
    host = SharedHost(cores=2, colocated_slowdown=1.5)
    assert [host.slowdown(k) for k in (1, 2, 3, 4)] == pytest.approx([1.0, 1.5, 2.25, 3.0])
    host.start(0.0, 1, 1.0)
    updates = host.start(0.0, 2, 2.0)
    assert finishes(updates) == {1: 1.5, 2: 3.0}
    stale = {job_id: version for job_id, _, version in updates}
    assert host.is_current(1, stale[1]) and not host.is_current(1, stale[1] - 1)
    with pytest.raises(ValueError, match="colocated_slowdown"):
        SharedHost(cores=2, colocated_slowdown=0.9)
    with pytest.raises(ValueError, match="host_cores"):
        SharedHost(cores=0, colocated_slowdown=1.0)


def test_a_lone_request_costs_the_same_on_a_shared_host():
    request = [SimRequest(0, 0.0, 256, 11, None, 0)]
    alone, shared = simulate_fixed(PROFILE, CONFIG, request, 1, 1), simulate_fixed(PROFILE, SHARED, request, 1, 1)
    assert shared.ttft_p50_s == pytest.approx(alone.ttft_p50_s) and shared.tpot_p50_s == pytest.approx(0.021)


def test_colocated_instances_slow_each_other():
    # Request 0 decodes 100 tokens (21 ms steps) while request 1's 0.5 s prompt is prefilled.
    requests = [SimRequest(0, 0.0, 100, 100, None, 0), SimRequest(1, 0.2, 500, 2, None, 0)]
    alone, shared = (ClusterSim(PROFILE, config, FixedScaler(1, 1), 1, 1).run(requests) for config in (CONFIG, SHARED))
    transfer_s = 500 * 1000 / 1e9
    # Request 1 waits for decode step boundaries three times (its Reserve, its KV noted, its
    # start): within three 21 ms steps (42 ms while sharing a core) beyond prompt and transfer.
    assert 0.5 + transfer_s <= alone.ttft[1] <= 0.5 + transfer_s + 3 * 0.021 + 1e-9
    # On one core the prompt gets half the CPU while request 0 decodes (until ~2.2 s): 1 s.
    assert 1.0 + transfer_s <= shared.ttft[1] <= 1.0 + transfer_s + 3 * 0.042 + 1e-9
    assert shared.ttft[0] == pytest.approx(alone.ttft[0])  # nothing else ran then
    # ... and the decode lost half the CPU for that 1 s: 0.5 s more over its 99 steps.
    assert shared.tpot[0] == pytest.approx(alone.tpot[0] + 0.5 / 99, rel=0.02)


def test_a_busy_decode_engine_answers_at_step_boundaries():
    # Request 0 decodes in 21 ms steps from its admission. Request 1 arrives mid-step: its
    # Reserve is answered when that step ends; its KV lands mid-step, is noted when that step
    # ends, and the request starts (first token) when the next one ends: the engine-core loop
    # handles messages and transfers between steps.
    requests = [SimRequest(0, 0.0, 100, 50, None, 0), SimRequest(1, 0.3, 100, 2, None, 0)]
    recorder = ClusterSim(PROFILE, CONFIG, FixedScaler(1, 1), 1, 1).run(requests)
    admitted_0 = recorder.ttft[0]

    def next_boundary(t: float) -> float:
        return admitted_0 + math.ceil((t - admitted_0) / 0.021) * 0.021

    reserved_1 = next_boundary(0.3)
    kv_lands_1 = reserved_1 + 0.1 + 100 * 1000 / 1e9  # its 0.1 s prompt + transfer
    assert recorder.ttft[1] + 0.3 == pytest.approx(next_boundary(kv_lands_1) + 0.021)


def test_the_request_path_overhead_delays_the_first_token():
    request = [SimRequest(0, 0.0, 500, 3, None, 0)]
    with_overhead = dataclasses.replace(WITH_TRANSFER, request_overhead_s=0.2)
    plain = simulate_fixed(WITH_TRANSFER, CONFIG, request, 1, 1).ttft_p50_s
    assert simulate_fixed(with_overhead, CONFIG, request, 1, 1).ttft_p50_s == pytest.approx(plain + 0.2)


def test_the_kv_transfer_time_comes_from_the_profile():
    request = [SimRequest(0, 0.0, 500, 3, None, 0)]
    summary = simulate_fixed(WITH_TRANSFER, CONFIG, request, 1, 1)
    assert summary.ttft_p50_s == pytest.approx(0.5 + 0.01 + 0.0001 * 500)


def test_least_cost_ratio_equals_brute_force():
    lengths = LengthModel(prompt_median=256, output_median=64, sigma=0.3, prefix_share=0.0)
    requests = make_trace("poisson", 8.0, 60.0, lengths, seed=4)
    config = dataclasses.replace(CONFIG, itl_slo_s=0.035)  # decode needs more than one instance
    result = least_cost_ratio(PROFILE, config, requests, target=0.9, max_per_pool=6)
    attainment = {(p, d): simulate_fixed(PROFILE, config, requests, p, d).slo_attainment
                  for p in range(1, 7) for d in range(1, 7)}
    cheapest = min(p + d for (p, d), value in attainment.items() if value >= 0.9)
    assert result.met and result.cost == cheapest
    assert attainment[(result.num_prefill, result.num_decode)] >= 0.9
    assert result.num_prefill >= 2 and result.num_decode >= 2  # both pools matter in this case
    assert len(result.tried) < len(attainment)  # it did not try everything


def test_queued_prompts_are_prefilled_together_within_the_token_budget():
    profile = dataclasses.replace(PROFILE, prefill_fit=[0.1, 0.001, 0.0])  # 0.1 s a step + 1 ms a token
    no_transfer = dataclasses.replace(CONFIG, kv_bytes_per_token=0)
    requests = [SimRequest(0, 0.0, 100, 2, None, 0), SimRequest(1, 0.05, 100, 2, None, 0),
                SimRequest(2, 0.05, 100, 2, None, 0)]
    batched = ClusterSim(profile, no_transfer, FixedScaler(1, 1), 1, 1).run(requests)
    # 0 runs alone (0.2 s); 1 and 2 wait, then share one step: 0.1 + 2 x 0.1 -> both done at 0.5
    assert [batched.ttft[i] + requests[i].arrival_s for i in range(3)] == pytest.approx([0.2, 0.5, 0.5])
    one_at_a_time = dataclasses.replace(no_transfer, max_prefill_batch_tokens=150)
    alone = ClusterSim(profile, one_at_a_time, FixedScaler(1, 1), 1, 1).run(requests)
    assert [alone.ttft[i] + requests[i].arrival_s for i in range(3)] == pytest.approx([0.2, 0.4, 0.6])
