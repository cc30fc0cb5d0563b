"""Every deploy/k8s/ manifest (deploy/k8s/gaie/ included) validates offline, no cluster, no
network: core kinds against the Kubernetes 1.33 OpenAPI schemas bundled with
kubernetes-validate, custom resources (InferencePool, Gateway, HTTPRoute) against their CRDs'
schemas vendored in tests/data/k8s-crds/. The parts autoscaling relies on are wired together:
probes, drain grace, PDBs, the planner's RBAC on the scale subresource."""

from pathlib import Path

import kubernetes_validate
import pytest
import jsonschema
import yaml

from tests.helpers.k8s_crds import crd_schemas, validate_custom_resource

K8S_DIR = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
K8S_VERSION = "1.33.0"
KEDA_SCALED_OBJECT = ("keda.sh/v1alpha1", "ScaledObject")  # a CRD not vendored: its target is checked


def documents() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(K8S_DIR.rglob("*.yaml")):
        name = path.relative_to(K8S_DIR).as_posix()
        found += [(name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def by_kind(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for _, doc in documents() if doc["kind"] == kind}


@pytest.mark.parametrize("name, doc", documents(), ids=lambda value: value if isinstance(value, str) else "")
def test_manifest_is_valid(name, doc):
    kind = (doc["apiVersion"], doc["kind"])
    if kind == KEDA_SCALED_OBJECT:
        assert doc["spec"]["scaleTargetRef"]["name"] in by_kind("Deployment")
    elif kind in crd_schemas():
        validate_custom_resource(doc)
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_an_invalid_manifest_is_rejected():
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


POOL = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": "p"},
        "spec": {"selector": {"matchLabels": {"app": "p"}}, "targetPorts": [{"number": 8000}]}}


def planted(path: str, value) -> dict:
    """POOL with one field set (value None: removed); path is dotted, list indexes as digits."""
    doc = yaml.safe_load(yaml.safe_dump(POOL))
    *parents, leaf = [int(part) if part.isdigit() else part for part in path.split(".")]
    target = doc
    for part in parents:
        target = target[part]
    if value is None:
        del target[leaf]
    else:
        target[leaf] = value
    return doc


def test_a_good_custom_resource_passes():
    validate_custom_resource(POOL)


@pytest.mark.parametrize("path, value, complaint", [
    ("spec.targetPort", 8000, "'targetPort' was unexpected"),  # a misspelt field
    ("spec.targetPorts.0.number", "8000", "is not of type 'integer'"),
    ("spec.targetPorts.0.number", 70000, "greater than the maximum"),
    ("spec.selector", None, "'selector' is a required property"),
    ("spec.endpointPickerRef", {"name": "epp", "failureMode": "Open"}, "is not one of"),
])
def test_a_bad_custom_resource_is_rejected_naming_the_field(path, value, complaint):
    with pytest.raises(jsonschema.ValidationError, match=complaint):
        validate_custom_resource(planted(path, value))


def test_a_kind_without_a_vendored_crd_is_refused():
    with pytest.raises(KeyError, match="no CRD"):
        validate_custom_resource({"apiVersion": "example.com/v1", "kind": "Widget"})


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
