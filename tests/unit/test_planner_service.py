"""The planner service around the pure logic: scraping gateway metrics into interval
statistics, Redis heartbeats into pool levels, one interval end to end with an actuator,
and the exported `pdserve:planner_*` metrics."""

import asyncio

import pytest

from services.planner.actuator import LogActuator
from services.planner.gateway_sample import interval_between, parse_sample, quantile
from services.planner.metrics import PlannerMetrics
from services.planner.observer import Observer, pool_levels
from services.planner.planner import Planner
from services.planner.service import PlannerService
from shared.cluster.instances import InstanceInfo, InstanceLoad
from shared.metrics.registry import render
from tests.unit.test_planner_logic import CONFIG, PROFILE


def gateway_text(requests: int, completed: int, prompt: int, generated: int, ttft_counts: tuple) -> str:
    bounds = ("0.1", "0.5", "1.0", "+Inf")
    lines = [f'pdserve:gateway_requests_total{{model_name="m"}} {requests}',
             f'pdserve:gateway_requests_completed_total{{model_name="m"}} {completed}',
             f'pdserve:gateway_prompt_tokens_total{{model_name="m"}} {prompt}',
             f'pdserve:gateway_generation_tokens_total{{model_name="m"}} {generated}']
    lines += [f'pdserve:gateway_time_to_first_token_seconds_bucket{{model_name="m",le="{b}"}} {c}'
              for b, c in zip(bounds, ttft_counts)]
    return "\n".join(["# TYPE pdserve:gateway_requests counter", *lines[:1],
                      "# TYPE pdserve:gateway_requests_completed counter", lines[1],
                      "# TYPE pdserve:gateway_prompt_tokens counter", lines[2],
                      "# TYPE pdserve:gateway_generation_tokens counter", lines[3],
                      "# TYPE pdserve:gateway_time_to_first_token_seconds histogram", *lines[4:]]) + "\n"


def test_interval_statistics_from_two_scrapes():
    before = parse_sample(gateway_text(10, 8, 800, 400, (0, 5, 8, 8)))
    after = parse_sample(gateway_text(110, 108, 26_400, 13_200, (0, 5, 98, 108)))
    interval = interval_between(before, after, seconds=10.0)
    assert interval.request_rate == 10.0
    assert (interval.mean_prompt_tokens, interval.mean_output_tokens) == (256.0, 128.0)
    # 100 new TTFTs: 90 in (0.5, 1.0], 10 above 1.0 -> p90 at the top of the (0.5, 1.0] bucket
    assert interval.ttft_p90_s == pytest.approx(1.0)
    assert interval.itl_p90_s is None


def test_quantile_interpolates_within_a_bucket():
    assert quantile({0.1: 0, 0.5: 10, float("inf"): 10}, 0.5) == pytest.approx(0.3)
    assert quantile({0.1: 0, float("inf"): 0}, 0.9) is None


def test_pool_levels_from_heartbeats():
    levels = pool_levels({"prefill": [InstanceLoad(2, 1, 10, 10), InstanceLoad(0, 1, 10, 10)],
                          "decode": [InstanceLoad(1, 30, 25, 100), InstanceLoad(0, 10, 75, 100)]})
    assert levels == {"prefill_queue_depth": 4, "decode_running": 40, "decode_queue_depth": 1, "kv_usage": 0.5,
                      "num_prefill": 2, "num_decode": 2}


class FakeRegistry:
    def __init__(self, records):
        self.records = records

    async def list_live(self, role=None):
        return self.records


def info(name: str, role: str) -> InstanceInfo:
    return InstanceInfo(name, role, "127.0.0.1:1", "", "m")


def test_one_interval_scales_each_pool_and_exports_it():
    texts = iter([gateway_text(0, 0, 0, 0, (0, 0, 0, 0)), gateway_text(100, 100, 25_600, 12_800, (0, 0, 0, 100))])
    clock = iter([0.0, 10.0, 10.0])
    registry = FakeRegistry([(info("p0", "prefill"), InstanceLoad()), (info("d0", "decode"), InstanceLoad())])
    observer = Observer(registry, ["http://gateway/metrics"], clock=lambda: next(clock),
                        fetch=lambda url: parse_sample(next(texts)))
    actuator = LogActuator(1, 1)
    service = PlannerService(Planner(CONFIG, PROFILE, 1, 1), observer, actuator, PlannerMetrics(),
                             clock=lambda: next(clock))

    async def two_scrapes():
        await observer.observe()
        return await service.step()

    decision = asyncio.run(two_scrapes())
    assert decision.observation.request_rate == 10.0 and decision.observation.num_decode == 1
    assert actuator.targets == {"prefill": 4, "decode": 2}
    text = render(service.metrics.registry).decode()
    assert 'pdserve:planner_desired_replicas{role="prefill"} 4.0' in text
    assert 'pdserve:planner_desired_replicas{role="decode"} 2.0' in text
    assert "pdserve:planner_observed_request_rate 10.0" in text
    assert 'pdserve:planner_scale_events_total{action="scale_out",role="prefill"} 1.0' in text


def test_an_unreachable_gateway_counts_as_no_traffic():
    def refuse(url):
        raise ConnectionRefusedError(url)

    observer = Observer(FakeRegistry([]), ["http://gone/metrics"], fetch=refuse)
    observation = asyncio.run(observer.observe())
    assert observation.request_rate == 0.0 and observation.num_prefill == 0
