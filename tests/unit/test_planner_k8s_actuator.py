"""The Kubernetes actuator's API calls, against an autospec of the official client's AppsV1Api
(the signatures are the real ones; no cluster is contacted)."""

from types import SimpleNamespace
from unittest.mock import create_autospec

from kubernetes import client

from services.planner.k8s_actuator import KubernetesActuator

DEPLOYMENTS = {"prefill": "pdserve-prefill", "decode": "pdserve-decode"}


def test_reads_and_patches_the_deployment_scale_subresource():
    api = create_autospec(client.AppsV1Api, instance=True)
    api.read_namespaced_deployment_scale.return_value = SimpleNamespace(spec=SimpleNamespace(replicas=3))
    actuator = KubernetesActuator(api, "pdserve", DEPLOYMENTS)
    assert actuator.replicas("decode") == 3
    api.read_namespaced_deployment_scale.assert_called_once_with("pdserve-decode", "pdserve")
    actuator.scale("prefill", 5)
    api.patch_namespaced_deployment_scale.assert_called_once_with("pdserve-prefill", "pdserve",
                                                                  {"spec": {"replicas": 5}})


def test_a_deployment_scaled_to_zero_reads_as_zero():
    api = create_autospec(client.AppsV1Api, instance=True)
    api.read_namespaced_deployment_scale.return_value = SimpleNamespace(spec=SimpleNamespace(replicas=None))
    assert KubernetesActuator(api, "pdserve", DEPLOYMENTS).replicas("prefill") == 0
