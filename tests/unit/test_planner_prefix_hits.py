"""The planner reads the prefix-hit ratio from the prefill instances' /metrics and sizes the
prefill pool for the tokens it still has to compute."""

import asyncio

import pytest

from services.planner.observer import Observer
from services.planner.planner import Planner
from services.planner.prefix_hits import PrefixCacheSample, PrefixHitTracker, parse_prefix_cache
from tests.unit.test_planner_logic import CONFIG, PROFILE, load
from tests.unit.test_planner_service import FakeRegistry


def instance_text(queries: int, hits: int) -> str:
    return ("# TYPE vllm:prefix_cache_queries counter\n"
            f'vllm:prefix_cache_queries_total{{model_name="m"}} {queries}\n'
            "# TYPE vllm:prefix_cache_hits counter\n"
            f'vllm:prefix_cache_hits_total{{model_name="m"}} {hits}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="m"} 3\n')


def test_parse_the_instance_counters():
    assert parse_prefix_cache(instance_text(1000, 250)) == PrefixCacheSample(1000.0, 250.0)
    assert parse_prefix_cache("") == PrefixCacheSample(0.0, 0.0)


def test_the_ratio_is_over_the_interval_and_summed_over_instances():
    counters = {"a": [(1000, 900), (2000, 1400)], "b": [(0, 0), (1000, 100)], "c": [(5000, 5000), (10, 0)]}
    calls = {url: iter(values) for url, values in counters.items()}
    tracker = PrefixHitTracker(lambda url: PrefixCacheSample(*next(calls[url])))
    assert tracker.observe(["a", "b", "c"]) is None  # first sight: no interval yet
    # a: 500 of 1000, b: 100 of 1000, c restarted (counters went back): left out
    assert tracker.observe(["a", "b", "c"]) == pytest.approx(600 / 2000)


def test_the_observer_reports_the_prefill_pools_hit_ratio():
    samples = iter([PrefixCacheSample(100, 0), PrefixCacheSample(1100, 900)])

    def unreachable(url):
        raise ConnectionRefusedError(url)

    observer = Observer(FakeRegistry([]), ["http://gone/metrics"], fetch=unreachable,
                        prefill_metrics_urls=lambda: ["http://prefill-0/metrics"],
                        fetch_prefix_cache=lambda url: next(samples))
    first, second = asyncio.run(observer.observe()), asyncio.run(observer.observe())
    assert first.prefix_hit_ratio is None and second.prefix_hit_ratio == pytest.approx(0.9)


def test_hits_shrink_the_prefill_pool_and_a_zero_ratio_counts():
    # 5 req/s of 512-token prompts, 1 ms a token: 2.56 instance-s/s, at the M/D/1 utilization
    # that keeps TTFT within 1 s for a 0.512 s prompt (66%) -> 4 instances. With 75% of the
    # tokens cached, 0.128 s a prompt: 0.64 instance-s/s at the 80% cap -> 1 instance.
    planner = Planner(CONFIG, PROFILE, 1, 1)
    decision = planner.plan(load(5.0, prompt=512, prefix_hit_ratio=0.75), now=0.0)
    assert decision.forecast.prefix_hit_ratio == pytest.approx(0.75)
    assert decision.prefill.needed == 1 and "128 ms/prompt" in decision.prefill.reason
    fresh = Planner(CONFIG, PROFILE, 1, 1).plan(load(5.0, prompt=512, prefix_hit_ratio=0.0), now=0.0)
    assert fresh.prefill.needed == 4
    # a later interval with no hits pulls the forecast down (0 is a sample, None is not)
    planner.plan(load(5.0, prompt=512, prefix_hit_ratio=None), now=10.0)
    assert planner.forecaster.predict().prefix_hit_ratio == pytest.approx(0.75)
    planner.plan(load(5.0, prompt=512, prefix_hit_ratio=0.0), now=20.0)
    assert planner.forecaster.predict().prefix_hit_ratio == pytest.approx(0.75 * 0.7)
