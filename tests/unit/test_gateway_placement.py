"""Conditional disaggregation on the gateway: the placement rule (pure), its thresholds from a
`pdserve profile`, and the flows against fake instances: a short prompt (after the decode
instance's own prefix-cache hits) is prefilled on the decode instance, a long one on the pool,
a refused local prefill goes to the pool into the same reservation, a busy pool sends prompts
to the decode instance; every decision is counted."""

import json

import pytest
from prometheus_client import generate_latest

from services.cost_model.perf_profile import DecodePoint, PerfProfile, PrefillPoint, TransferPoint
from services.gateway.placement import PlacementPolicy, place_prefill, prefill_backlog
from services.gateway.placement_profile import (
    DEFAULT_BUSY_MAX_LOCAL_TOKENS, DEFAULT_MAX_LOCAL_TOKENS, derived_thresholds, placement_policy)
from services.gateway.router import Candidate
from services.gateway.settings import GatewaySettings
from shared.cluster.instances import InstanceLoad
from shared.errors import ConfigurationError
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import Behaviour, FakeInstance, register
from tests.unit.metrics_scrape import parse, value
from tests.unit.test_gateway_service import (  # noqa: F401 - model is a fixture
    MODEL_NAME, PROMPT_IDS, collect, gateway, generate_request, model, run)

POLICY = PlacementPolicy(max_local_tokens=16, busy_max_local_tokens=64, busy_backlog=2)


@pytest.mark.parametrize("num_uncached, backlog, expected", [
    (16, 0, ("decode_local", "short_prompt")),
    (17, 0, ("prefill_pool", "long_prompt")),
    (17, 1, ("prefill_pool", "long_prompt")),
    (17, 2, ("decode_local", "prefill_busy")),
    (64, 5, ("decode_local", "prefill_busy")),
    (65, 5, ("prefill_pool", "long_prompt")),
    (40, None, ("decode_local", "prefill_busy")),  # no prefill instance live: the pool is as busy as can be
])
def test_the_placement_rule(num_uncached, backlog, expected):
    placement = place_prefill(POLICY, num_uncached, backlog)
    assert (placement.where, placement.reason) == expected


def test_the_rule_can_be_switched_off_rule_by_rule():
    assert place_prefill(PlacementPolicy(), 1, None).reason == "off"
    only_busy = PlacementPolicy(max_local_tokens=0, busy_max_local_tokens=64, busy_backlog=2)
    assert place_prefill(only_busy, 1, 0).reason == "long_prompt"
    assert place_prefill(only_busy, 1, 2).reason == "prefill_busy"
    never_busy = PlacementPolicy(max_local_tokens=16, busy_max_local_tokens=64, busy_backlog=0)
    assert place_prefill(never_busy, 17, 100).reason == "long_prompt"


def test_the_backlog_is_the_least_loaded_healthy_prefill_instances():
    def prefill(name, queued, running, suspect=False):
        return Candidate(name, "prefill", "", queue_depth=queued, num_running=running, is_suspect=suspect)
    assert prefill_backlog([prefill("a", 3, 1), prefill("b", 1, 1), prefill("c", 0, 0, suspect=True)]) == 2
    assert prefill_backlog([prefill("c", 0, 1, suspect=True)]) == 1
    assert prefill_backlog([]) is None


def hand_made_profile(**changes) -> PerfProfile:
    """prefill_s(n) = 0.07 + 0.0015 n; decode step 0.08 s; transfer 1 ms + 20 us a token."""
    values = dict(model="m", dtype="bfloat16", num_threads=1, block_size=16, kv_capacity_tokens=10_000,
                  prefill=[PrefillPoint(n, 0, 0.07 + 0.0015 * n) for n in (16, 64, 256, 1024)],
                  decode=[DecodePoint(b, c, 0.08) for b in (1, 8) for c in (128, 512)],
                  transfer=[TransferPoint(n, 0.001 + 0.00002 * n) for n in (64, 256, 1024)],
                  request_overhead_s=0.02)
    return PerfProfile(**{**values, **changes})


def test_thresholds_from_a_profile():
    # Local while 0.0015 (n - 1) <= 0.02 + 0.001 + 0.00002 n  ->  n <= 15.3;
    # busy while 0.0015 (n - 1) <= 0.08                        ->  n <= 54.3.
    assert derived_thresholds(hand_made_profile()) == (15, 54)
    # Without a measured overhead only the transfer counts: 0.0015 (n - 1) <= 0.001 + 0.00002 n.
    assert derived_thresholds(hand_made_profile(request_overhead_s=0.0)) == (1, 54)


def test_the_policy_takes_the_profile_for_the_thresholds_not_given(tmp_path):
    path = tmp_path / "profile.json"
    hand_made_profile().save(path)
    assert placement_policy(None, None, 2, None) == PlacementPolicy(DEFAULT_MAX_LOCAL_TOKENS,
                                                                    DEFAULT_BUSY_MAX_LOCAL_TOKENS, 2)
    assert placement_policy(None, None, 3, str(path)) == PlacementPolicy(15, 54, 3)
    assert placement_policy(100, None, 3, str(path)) == PlacementPolicy(100, 54, 3)
    settings = GatewaySettings(profile=str(path), local_prefill_busy_max_tokens=0)
    assert settings.placement_policy() == PlacementPolicy(15, 0, 2)


def test_a_bad_profile_stops_the_gateway_naming_the_setting(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"version": 99}))
    with pytest.raises(ConfigurationError, match="^profile"):
        GatewaySettings(profile=str(path))
    with pytest.raises(ConfigurationError, match="^profile"):
        GatewaySettings(profile=str(tmp_path / "missing.json"))


def placements(gate) -> dict[tuple[str, str], float]:
    samples = parse(generate_latest(gate.server.metrics.registry).decode())
    return {(where, reason): value(samples, "pdserve:gateway_prefill_placement_total", where=where, reason=reason)
            for (where, reason) in gate.stats.placements}


def test_a_short_prompt_is_prefilled_on_the_decode_instance(redis_server, model):  # noqa: F811
    async def scenario():
        # 50 prompt tokens, 32 of them held by the decode instance: 18 uncached there.
        async with gateway(redis_server.url, model, local_prefill_max_tokens=18) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode", Behaviour(num_cached_prompt_tokens=32))
            await gate.add(p0, d0)
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert [t for m in messages for t in m.token_ids] == [42, 43, 44]
            assert p0.methods() == [] and d0.methods() == ["Reserve", "PrefillLocally"]
            assert d0.requests_of("PrefillLocally")[0].request_id == d0.requests_of("Reserve")[0].request_id
            assert placements(gate) == {("decode_local", "short_prompt"): 1}
    run(scenario)


def test_a_long_prompt_and_a_refused_local_prefill_go_to_the_pool(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, local_prefill_max_tokens=17) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode", Behaviour(num_cached_prompt_tokens=32))
            await gate.add(p0, d0)
            await collect(gate.stub.Generate(generate_request(max_tokens=3)))  # 18 uncached: too long
            assert p0.methods() == ["StreamPrefill"] and d0.methods() == ["Reserve", "Decode"]
            d0.behaviour.num_cached_prompt_tokens = 34  # 16 uncached, but the decode instance refuses
            d0.behaviour.local_prefill_refused = True
            messages = await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert [t for m in messages for t in m.token_ids] == [42, 43, 44]
            assert d0.methods()[2:] == ["Reserve", "PrefillLocally", "Decode"]  # the same reservation
            assert p0.methods() == ["StreamPrefill"] * 2
            assert placements(gate) == {("prefill_pool", "long_prompt"): 1, ("decode_local", "short_prompt"): 1,
                                        ("prefill_pool", "decode_refused"): 1}
    run(scenario)


def test_a_busy_prefill_pool_sends_prompts_to_the_decode_instance(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model, local_prefill_max_tokens=0, local_prefill_busy_max_tokens=50,
                           prefill_busy_backlog=3) as gate:
            p0 = FakeInstance("p0", "prefill")
            d0 = FakeInstance("d0", "decode")
            await gate.add(d0)
            await p0.start()
            gate.fakes.append(p0)
            await register(gate.registry, p0, MODEL_NAME, InstanceLoad(2, 1, 50, 100))  # 3 prompts on it
            await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert p0.methods() == [] and d0.methods() == ["Reserve", "PrefillLocally"]
            await register(gate.registry, p0, MODEL_NAME, InstanceLoad(1, 1, 50, 100))  # 2: not busy
            await collect(gate.stub.Generate(generate_request(max_tokens=3)))
            assert p0.methods() == ["StreamPrefill"]
            assert placements(gate) == {("decode_local", "prefill_busy"): 1, ("prefill_pool", "long_prompt"): 1}
    run(scenario)
