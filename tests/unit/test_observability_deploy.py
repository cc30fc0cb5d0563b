"""deploy/observability and deploy/compose/observability.yml: the Grafana dashboard queries
only metrics the code exports, its data sources are provisioned, Prometheus scrapes every
pdserve service on the port the compose file gives its /metrics, and the observability
override is valid compose that points every service's traces at the Jaeger it adds."""

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.unit.test_compose_file import COMPOSE_FILE, PDSERVE_SERVICES, compose_config

REPO_ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = REPO_ROOT / "deploy" / "observability"
DASHBOARDS = sorted((OBSERVABILITY / "grafana" / "dashboards").glob("*.json"))
OVERRIDE = REPO_ROOT / "deploy" / "compose" / "observability.yml"
# How a family's name appears in an exposition: counters get _total, histograms _bucket/_sum/_count.
SAMPLE_SUFFIX = r"(_total|_bucket|_sum|_count|_created)?"
METRIC_IN_SOURCE = re.compile(r'f?"((?:pdserve|vllm):[a-z0-9_{}]+)"')
METRIC_IN_QUERY = re.compile(r"\b((?:pdserve|vllm):[a-zA-Z0-9_:]+)")


def exported_name_patterns() -> list[re.Pattern]:
    """Every metric family name in shared/ and services/ (an f-string's fields match any name part)."""
    patterns = set()
    for package in ("shared", "services"):
        for path in (REPO_ROOT / package).rglob("*.py"):
            for name in METRIC_IN_SOURCE.findall(path.read_text()):
                patterns.add(re.sub(r"\\\{[^}]*\\\}", "[a-z0-9_]+", re.escape(name)))
    return [re.compile(pattern + SAMPLE_SUFFIX) for pattern in sorted(patterns)]


def is_exported(name: str, patterns: list[re.Pattern]) -> bool:
    return any(pattern.fullmatch(name) for pattern in patterns)


def queries(dashboard: dict) -> list[str]:
    panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


@pytest.fixture(scope="module")
def patterns() -> list[re.Pattern]:
    return exported_name_patterns()


def test_the_name_check_can_fail(patterns):
    assert is_exported("pdserve:gateway_time_to_first_token_seconds_bucket", patterns)
    assert is_exported("pdserve:kv_transfer_bytes_total", patterns)  # an f-string family
    assert not is_exported("pdserve:gateway_time_to_first_token_seconds_p99", patterns)
    assert not is_exported("pdserve:no_such_metric_total", patterns)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_every_metric_a_dashboard_queries_exists_in_the_code(path, patterns):
    dashboard = json.loads(path.read_text())
    names = {name for expr in queries(dashboard) for name in METRIC_IN_QUERY.findall(expr)}
    assert names, "the dashboard queries no pdserve metric"
    assert sorted(name for name in names if not is_exported(name, patterns)) == []


def test_the_dashboard_covers_what_operators_watch():
    [dashboard] = [json.loads(path.read_text()) for path in DASHBOARDS if path.name == "pdserve.json"]
    text = " ".join(queries(dashboard))
    for metric in ("gateway_requests_total", "gateway_time_to_first_token_seconds_bucket",
                   "gateway_inter_token_latency_seconds_bucket", "gateway_e2e_request_latency_seconds_bucket",
                   "kv_cache_usage_perc", "kv_transfer_bytes_total", "kv_transfer_seconds_total",
                   "lease_expiries_total", "migrations_total", "planner_desired_replicas",
                   "gateway_live_incompatible_pairs", "gateway_draining_instances",
                   "gateway_key_requests_admitted_total", "gateway_key_requests_limited_total"):
        assert metric in text, metric
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboards_use_only_provisioned_data_sources():
    provisioned = yaml.safe_load((OBSERVABILITY / "grafana" / "provisioning" / "datasources"
                                  / "datasources.yml").read_text())["datasources"]
    uids = {source["uid"] for source in provisioned}
    assert {source["type"] for source in provisioned} == {"prometheus", "jaeger"}
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        used = {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p}
        used |= {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
        assert used <= uids, path.name


def test_prometheus_scrapes_every_service_on_its_metrics_port():
    config = compose_config(COMPOSE_FILE)
    scrape = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())["scrape_configs"]
    targets = {sd["names"][0]: sd["port"] for job in scrape for sd in job["dns_sd_configs"]}
    for service in PDSERVE_SERVICES:
        assert targets[service] == int(config["services"][service]["environment"]["PDSERVE_METRICS_PORT"])
    planner_env = config["services"]["planner"]["environment"]
    assert targets["planner"] == int(planner_env["PDSERVE_PLANNER_METRICS_PORT"])


def test_the_override_is_valid_compose_and_traces_every_service_to_jaeger():
    config = compose_config(COMPOSE_FILE, OVERRIDE)
    services = config["services"]
    assert {"jaeger", "prometheus", "grafana"} <= set(services)
    for service in PDSERVE_SERVICES:
        assert services[service]["environment"]["PDSERVE_OTLP_TRACES_ENDPOINT"] == "http://jaeger:4317"
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            assert Path(source).exists(), source
