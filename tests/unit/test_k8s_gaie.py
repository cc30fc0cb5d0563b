"""deploy/k8s/gaie/ is wired together: the InferencePool selects the prefill and decode pods
and targets the port decode pods serve OpenAI HTTP on (and prefill pods gRPC on, the address
the scheduler hands to decode pods); the endpoint picker's configuration (llm-d's
EndpointPickerConfig) uses only plugins its image has, references only what it declares, and
agrees with the pods' settings (block size, hash seed, KV-event port and topic); the route
reaches the pool; the planner scales exactly the two GAIE Deployments. Every GAIE-only
setting is set in one place, 10-settings.yaml. Schemas are test_k8s_manifests.py's job."""

import urllib.parse
from functools import cache
from pathlib import Path

import pytest
import yaml

from services.planner.flags import PlannerPolicySettings
from services.planner.gateway_sample import interval_between, parse_sample
from services.planner.main import PlannerServiceSettings
from tests.unit.test_k8s_manifests import K8S_DIR, documents

GAIE_DIR = K8S_DIR / "gaie"
PLUGIN_TYPES = Path(__file__).resolve().parents[1] / "data" / "k8s-crds" / "llm-d-epp-plugin-types.txt"
ROLES = ("prefill", "decode")


@cache
def all_documents() -> tuple[tuple[str, dict], ...]:
    """Parsed once; callers copy what they change."""
    return tuple(documents())


def gaie(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for name, doc in all_documents()
            if name.startswith("gaie/") and doc["kind"] == kind}


def settings(*names: str) -> dict[str, str]:
    config_maps = gaie("ConfigMap")
    return {key: value for name in names for key, value in config_maps[name]["data"].items()}


def pod(role: str) -> dict:
    return gaie("Deployment")[f"pdserve-gaie-{role}"]["spec"]["template"]


def container_env(role: str) -> dict[str, str | None]:
    """The pod's environment: its ConfigMaps, then its own variables (None: from the pod)."""
    [container] = pod(role)["spec"]["containers"]
    env = settings(*[source["configMapRef"]["name"] for source in container.get("envFrom", [])])
    return env | {item["name"]: item.get("value") for item in container["env"]}


def container_port(role: str, port_name: str) -> int:
    [container] = pod(role)["spec"]["containers"]
    return next(port["containerPort"] for port in container["ports"] if port["name"] == port_name)


def epp_config() -> dict:
    """A fresh copy each call (tests change it)."""
    return yaml.safe_load(gaie("ConfigMap")["pdserve-epp"]["data"]["config.yaml"])


def epp_plugin(plugin_type: str) -> dict:
    return next(plugin for plugin in epp_config()["plugins"] if plugin["type"] == plugin_type)


def epp_args() -> dict[str, str]:
    [container] = gaie("Deployment")["pdserve-epp"]["spec"]["template"]["spec"]["containers"]
    return dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])


def target_port() -> int:
    [port] = gaie("InferencePool")["pdserve"]["spec"]["targetPorts"]
    return port["number"]


@pytest.mark.parametrize("role", ROLES)
def test_the_pool_selects_both_roles_labelled_for_llm_d_filters(role):
    labels = pod(role)["metadata"]["labels"]
    assert gaie("InferencePool")["pdserve"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels["llm-d.ai/role"] == role


def test_the_target_port_is_decode_http_and_prefill_grpc():
    assert int(container_env("decode")["PDSERVE_OPENAI_PORT"]) == container_port("decode", "http") == target_port()
    assert int(container_env("prefill")["PDSERVE_GRPC_PORT"]) == container_port("prefill", "grpc") == target_port()


def test_the_pool_calls_the_endpoint_picker_service_and_the_picker_reads_this_pool():
    pool = gaie("InferencePool")["pdserve"]
    ref = pool["spec"]["endpointPickerRef"]
    service = gaie("Service")[ref["name"]]
    assert ref["port"]["number"] in [port["port"] for port in service["spec"]["ports"] if port["name"] == "grpc"]
    assert ref["failureMode"] == "FailClose"  # the gateway must never pick a prefill pod itself
    args = epp_args()
    assert (args["pool-name"], args["pool-namespace"]) == (pool["metadata"]["name"], pool["metadata"]["namespace"])
    assert args["pool-group"] == pool["apiVersion"].split("/")[0]
    assert all(int(args["model-server-metrics-port"]) == int(container_env(role)["PDSERVE_METRICS_PORT"])
               for role in ROLES)


def test_the_picker_config_uses_only_plugins_its_image_has():
    config = epp_config()
    assert (config["apiVersion"], config["kind"]) == ("inference.networking.x-k8s.io/v1alpha1", "EndpointPickerConfig")
    known = set(PLUGIN_TYPES.read_text().split())
    assert {plugin["type"] for plugin in config["plugins"]} <= known


def declared_plugins(config: dict) -> set[str]:
    """A plugin is referenced by its name, which defaults to its type."""
    return {plugin.get("name", plugin["type"]) for plugin in config["plugins"]}


def references(config: dict) -> list[str]:
    refs = [plugin["pluginRef"] for profile in config["schedulingProfiles"] for plugin in profile["plugins"]]
    for source in config.get("dataLayer", {}).get("sources", []):
        refs += [source["pluginRef"], *[extractor["pluginRef"] for extractor in source.get("extractors", [])]]
    handler = epp_plugin("disagg-profile-handler")["parameters"]
    return refs + list(handler["deciders"].values())


def test_the_picker_config_references_only_declared_plugins():
    config = epp_config()
    assert set(references(config)) <= declared_plugins(config)


def test_a_config_referencing_an_undeclared_plugin_is_caught():
    config = epp_config()
    config["schedulingProfiles"][0]["plugins"].append({"pluginRef": "prefix-scorer"})
    assert set(references(config)) - declared_plugins(config) == {"prefix-scorer"}


def test_the_p_d_profiles_filter_by_role_and_pick_one_pod():
    profiles = {profile["name"]: [plugin["pluginRef"] for plugin in profile["plugins"]]
                for profile in epp_config()["schedulingProfiles"]}
    handler = epp_plugin("disagg-profile-handler")["parameters"]
    assert set(handler["profiles"].values()) == set(profiles) == set(ROLES)
    for role in ROLES:
        assert f"{role}-filter" in profiles[role] and "max-score-picker" in profiles[role]
        assert {"precise-prefix-cache-scorer", "queue-scorer"} <= set(profiles[role])
    assert "kv-cache-utilization-scorer" in profiles["decode"]
    epp_plugin("disagg-headers-handler")  # sends the prefill pod to the decode pod


@pytest.mark.parametrize("role", ROLES)
def test_the_prefix_scorer_hashes_as_the_pods_do_and_subscribes_where_they_publish(role):
    env = container_env(role)
    scorer = epp_plugin("precise-prefix-cache-scorer")["parameters"]
    assert env["PDSERVE_PREFIX_HASH_ALGO"] == "sha256_cbor"
    assert scorer["tokenProcessorConfig"]["hashSeed"] == env["PYTHONHASHSEED"]
    assert scorer["tokenProcessorConfig"]["blockSize"] == int(env["PDSERVE_BLOCK_SIZE"])
    events = scorer["kvEventsConfig"]
    assert events["discoverPods"] is True
    assert env["PDSERVE_KV_EVENTS_ENDPOINT"] == f"tcp://*:{events['podDiscoveryConfig']['socketPort']}"
    assert container_port(role, "kv-events") == events["podDiscoveryConfig"]["socketPort"]
    # llm-d keys a pod's blocks by "<pod IP>:<target port>", read from the topic.
    assert env["PDSERVE_KV_EVENTS_TOPIC"].startswith(f"{events['topicFilter']}$(POD_IP):{target_port()}@")


def test_the_route_sends_requests_to_the_pool_through_the_gateway():
    route = gaie("HTTPRoute")["pdserve"]
    [parent] = route["spec"]["parentRefs"]
    assert parent["name"] in gaie("Gateway")
    [rule] = route["spec"]["rules"]
    [backend] = rule["backendRefs"]
    assert (backend["group"], backend["kind"]) == ("inference.networking.k8s.io", "InferencePool")
    assert backend["name"] in gaie("InferencePool")


def standard_deployments() -> dict[str, dict]:
    """deploy/k8s/'s own Deployments (not gaie/'s)."""
    return {doc["metadata"]["name"]: doc for name, doc in all_documents()
            if "/" not in name and doc["kind"] == "Deployment"}


def test_gaie_only_settings_live_in_the_settings_file():
    """A GAIE pod sets what deploy/k8s's pod of its role sets (the same names), its addresses,
    and nothing else: the GAIE settings (KV events, hash, OpenAI port) come from 10-settings.yaml."""
    standard = {role: {item["name"] for item in standard_deployments()[f"pdserve-{role}"]["spec"]["template"]
                       ["spec"]["containers"][0]["env"]} for role in ROLES}
    own = {"POD_IP", "PDSERVE_KV_EVENTS_TOPIC"}  # per pod: the topic carries the pod's address
    for role in ROLES:
        [container] = pod(role)["spec"]["containers"]
        names = {item["name"] for item in container["env"]}
        assert names - standard[role] <= own, role
        assert not set(settings("pdserve-gaie-engine", "pdserve-gaie-decode")) & names, role


def test_the_planner_scales_exactly_the_two_gaie_pools_through_the_scale_subresource():
    [rule, *_] = gaie("Role")["pdserve-gaie-planner"]["rules"]
    assert rule["resources"] == ["deployments/scale"] and "patch" in rule["verbs"]
    assert sorted(rule["resourceNames"]) == sorted(f"pdserve-gaie-{role}" for role in ROLES)
    planner = gaie("Deployment")["pdserve-gaie-planner"]["spec"]["template"]["spec"]
    env = {item["name"]: item for item in planner["containers"][0]["env"]}
    assert env["PDSERVE_PLANNER_ACTUATOR"]["value"] == "kubernetes"
    for role in ROLES:
        assert env[f"PDSERVE_PLANNER_K8S_{role.upper()}_DEPLOYMENT"]["value"] == f"pdserve-gaie-{role}"
    # It reads the heartbeats the GAIE pods write under their deployment name.
    assert env["PDSERVE_DEPLOYMENT"]["valueFrom"]["configMapKeyRef"] == {"name": "pdserve-gaie-engine",
                                                                         "key": "PDSERVE_DEPLOYMENT"}


def planner_variables() -> set[str]:
    names = set()
    for settings_class in (PlannerServiceSettings, PlannerPolicySettings):
        prefix = settings_class.model_config.get("env_prefix", "")
        for name, field in settings_class.model_fields.items():
            names.add(field.validation_alias if isinstance(field.validation_alias, str) else prefix + name.upper())
    return names


def test_every_planner_variable_is_one_the_planner_reads():
    planner = gaie("Deployment")["pdserve-gaie-planner"]["spec"]["template"]["spec"]
    assert {item["name"] for item in planner["containers"][0]["env"]} <= planner_variables()


def test_the_planner_reads_the_decode_pods_request_counters_from_prometheus_federation():
    planner = gaie("Deployment")["pdserve-gaie-planner"]["spec"]["template"]["spec"]
    url = next(item["value"] for item in planner["containers"][0]["env"]
               if item["name"] == "PDSERVE_PLANNER_GATEWAY_METRICS_URLS")
    [selector] = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["match[]"]
    assert selector == '{__name__=~"pdserve:gateway_.+",pod=~"pdserve-gaie-decode-.+"}'


FEDERATED = """# TYPE pdserve:gateway_requests_total untyped
pdserve:gateway_requests_total{{pod="pdserve-gaie-decode-a"}} {a}
pdserve:gateway_requests_total{{pod="pdserve-gaie-decode-b"}} {b}
"""


def test_a_federated_answer_sums_the_pods_counters():
    before = parse_sample(FEDERATED.format(a=10, b=20))
    after = parse_sample(FEDERATED.format(a=25, b=45))
    assert after.counters["requests"] == 70
    assert interval_between(before, after, 10.0).request_rate == 4.0
