"""GAIE's model-server protocol on every instance's /metrics: vllm:lora_requests_info, a gauge
whose labels name max_lora and the adapters of the running and waiting requests (comma
separated) and whose value is when it was read, so an endpoint picker takes the newest."""

import time

from prometheus_client import generate_latest

from shared.engine_api.client import EngineLoad, EngineStatus
from shared.metrics.engine_collector import EngineCollector
from shared.metrics.registry import new_registry
from tests.unit.metrics_scrape import parse

LABELS = {"model_name": "m", "role": "colocated", "instance_id": "i0"}


def status_with(running: tuple[str, ...], waiting: tuple[str, ...]) -> EngineStatus:
    load = EngineLoad(num_waiting=3, num_running=2, num_reserved=0, num_free_blocks=30, num_total_blocks=40,
                      running_lora_adapters=running, waiting_lora_adapters=waiting)
    return EngineStatus(load, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def scrape_collector(status: EngineStatus, max_loras: int) -> list:
    registry = new_registry()
    registry.register(EngineCollector(lambda: status, LABELS, max_loras=max_loras))
    return parse(generate_latest(registry).decode())


def samples_named(samples, name) -> list[tuple[dict[str, str], float]]:
    return [(dict(labels), value) for (sample_name, labels), value in samples.items() if sample_name == name]


def test_lora_requests_info_names_the_adapters_and_is_stamped_with_the_read_time():
    before = time.time()
    samples = scrape_collector(status_with(("a", "b"), ("c",)), max_loras=4)
    [(labels, stamp)] = samples_named(samples, "vllm:lora_requests_info")
    assert labels == {**LABELS, "max_lora": "4", "running_lora_adapters": "a,b", "waiting_lora_adapters": "c"}
    assert stamp >= before


def test_without_adapters_the_labels_are_empty_and_max_lora_zero():
    samples = scrape_collector(status_with((), ()), max_loras=0)
    [(labels, _)] = samples_named(samples, "vllm:lora_requests_info")
    assert (labels["max_lora"], labels["running_lora_adapters"], labels["waiting_lora_adapters"]) == ("0", "", "")


def test_the_queue_running_and_kv_usage_gauges_of_the_protocol():
    samples = scrape_collector(status_with((), ()), max_loras=0)
    assert samples_named(samples, "vllm:num_requests_waiting") == [(LABELS, 3.0)]
    assert samples_named(samples, "vllm:num_requests_running") == [(LABELS, 2.0)]
    assert samples_named(samples, "vllm:kv_cache_usage_perc") == [(LABELS, 0.25)]
