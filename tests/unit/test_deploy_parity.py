"""Compose and Kubernetes run pdserve the same way: each role in the same image with the same
command and the same PDSERVE_* variables, set to the same values except where the platform
differs (service names, addresses from the pod, sizes fitted to a cluster's pods), each such
difference listed below with its reason. A variable added to one file must be added to the
other, or listed here."""

import pytest

from tests.unit.test_compose_file import config  # noqa: F401 - fixture
from tests.unit.test_k8s_manifests import by_kind

ROLES = ("gateway", "prefill", "decode", "planner")
# Set in only one of the two, and why.
ONLY_IN_K8S = {
    "PDSERVE_ADVERTISE_HOST": "the pod IP from the downward API (compose: the entrypoint finds the container's)",
    "PDSERVE_UCX_HOST": "the pod IP from the downward API (compose: the entrypoint finds the container's)",
    "PDSERVE_PLANNER_K8S_NAMESPACE": "the Kubernetes actuator's namespace",
}
ONLY_IN_COMPOSE: dict[str, str] = {}
# Set in both, to values that differ, and why.
DIFFERENT_VALUES = {
    "PDSERVE_REDIS_URL": "Redis's service name: redis (compose), pdserve-redis (Kubernetes)",
    "PDSERVE_KV_CACHE_MEMORY_GB": "compose runs on one machine (1 GiB each); pods get 8 GiB limits (4 GiB)",
    "PDSERVE_PLANNER_ACTUATOR": "docker (compose) or kubernetes",
    "PDSERVE_PLANNER_GATEWAY_METRICS_URLS": "the gateway's service name and metrics port",
    "PDSERVE_PLANNER_MAX_PREFILL": "a cluster has room for more instances than one machine",
    "PDSERVE_PLANNER_MAX_DECODE": "a cluster has room for more instances than one machine",
    "PDSERVE_API_KEY": "from the shell or .env (compose), from a Secret (Kubernetes)",
}


def k8s_container(role: str) -> dict:
    [container] = by_kind("Deployment")[f"pdserve-{role}"]["spec"]["template"]["spec"]["containers"]
    return container


def k8s_env(role: str) -> dict[str, str | None]:
    """name -> value (None for one taken from the pod or a Secret)."""
    return {item["name"]: item.get("value") for item in k8s_container(role)["env"]}


@pytest.mark.parametrize("role", ROLES)
def test_same_image_and_command(config, role):  # noqa: F811
    service = config["services"][role]
    container = k8s_container(role)
    assert container["image"] == service["image"]
    assert container["args"] == service["command"] == [role]


@pytest.mark.parametrize("role", ROLES)
def test_same_variables(config, role):  # noqa: F811
    compose = set(config["services"][role]["environment"])
    k8s = set(k8s_env(role))
    assert k8s - compose <= set(ONLY_IN_K8S), f"only in deploy/k8s: {sorted(k8s - compose - set(ONLY_IN_K8S))}"
    assert compose - k8s <= set(ONLY_IN_COMPOSE), f"only in compose: {sorted(compose - k8s - set(ONLY_IN_COMPOSE))}"


@pytest.mark.parametrize("role", ROLES)
def test_same_values(config, role):  # noqa: F811
    compose = config["services"][role]["environment"]
    k8s = k8s_env(role)
    differing = {name: (compose[name], k8s[name]) for name in set(compose) & set(k8s)
                 if str(compose[name]) != k8s[name] and name not in DIFFERENT_VALUES}
    assert differing == {}, "compose vs deploy/k8s"


@pytest.mark.parametrize("role", ("prefill", "decode"))
def test_the_instances_listen_where_the_pods_declare(config, role):  # noqa: F811
    port = int(config["services"][role]["environment"]["PDSERVE_GRPC_PORT"])
    assert {"name": "grpc", "containerPort": port} in k8s_container(role)["ports"]
    assert str(port) in [str(exposed) for exposed in config["services"][role]["expose"]]


def test_every_listed_difference_still_exists(config):  # noqa: F811
    compose = {name for role in ROLES for name in config["services"][role]["environment"]}
    k8s = {name for role in ROLES for name in k8s_env(role)}
    assert set(ONLY_IN_K8S) <= k8s - compose
    assert set(DIFFERENT_VALUES) <= compose & k8s
