"""Every deploy/k8s/ manifest validates against the Kubernetes 1.33 OpenAPI schemas bundled
with kubernetes-validate (offline: no cluster, no network), and the parts autoscaling relies
on are wired together: probes, drain grace, PDBs, the planner's RBAC on the scale subresource."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

K8S_DIR = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
K8S_VERSION = "1.33.0"
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject")}  # CRDs: not in the core schemas


def documents() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(K8S_DIR.rglob("*.yaml")):
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def by_kind(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for _, doc in documents() if doc["kind"] == kind}


@pytest.mark.parametrize("name, doc", documents(), ids=lambda value: value if isinstance(value, str) else "")
def test_manifest_is_valid(name, doc):
    if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
        assert doc["spec"]["scaleTargetRef"]["name"] in by_kind("Deployment")
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_an_invalid_manifest_is_rejected():
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


@pytest.mark.parametrize("role, port", [("prefill", 50052), ("decode", 50053)])
def test_pools_have_health_probes_drain_grace_and_a_pdb(role, port):
    deployment = by_kind("Deployment")[f"pdserve-{role}"]
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["readinessProbe"]["grpc"] == {"port": port, "service": "pdserve.v1.Instance"}
    env = {item["name"]: item.get("value") for item in container["env"]}
    drain_s = float(env["PDSERVE_DRAIN_TIMEOUT_S"]) + float(env["PDSERVE_SHUTDOWN_GRACE_S"])
    assert pod["terminationGracePeriodSeconds"] > drain_s
    assert "preStop" in container["lifecycle"] and container["resources"]["requests"]
    assert by_kind("PodDisruptionBudget")[f"pdserve-{role}"]["spec"]["selector"] == deployment["spec"]["selector"]


def test_planner_may_scale_exactly_the_two_pools():
    [rule, *_] = by_kind("Role")["pdserve-planner"]["rules"]
    assert rule["resources"] == ["deployments/scale"] and "patch" in rule["verbs"]
    assert sorted(rule["resourceNames"]) == ["pdserve-decode", "pdserve-prefill"]
    planner = by_kind("Deployment")["pdserve-planner"]["spec"]["template"]["spec"]
    assert planner["serviceAccountName"] == by_kind("RoleBinding")["pdserve-planner"]["subjects"][0]["name"]
    env = {item["name"]: item.get("value") for item in planner["containers"][0]["env"]}
    assert env["PDSERVE_PLANNER_ACTUATOR"] == "kubernetes"
