"""KubernetesActuator: sets the prefill and decode Deployments' replicas through the scale
subresource (the official `kubernetes` client). Scale-in is the Deployment removing pods:
each gets SIGTERM, drains within terminationGracePeriodSeconds (see deploy/k8s/)."""

import logging

logger = logging.getLogger(__name__)


class KubernetesActuator:
    def __init__(self, apps_api, namespace: str, deployments: dict[str, str]):
        """`apps_api`: a kubernetes.client.AppsV1Api (or a fake with the same two methods)."""
        self.apps_api = apps_api
        self.namespace = namespace
        self.deployments = dict(deployments)

    @classmethod
    def in_cluster(cls, namespace: str, deployments: dict[str, str]) -> "KubernetesActuator":
        """Authenticate with the pod's service account (the planner's RBAC Role)."""
        from kubernetes import client, config
        config.load_incluster_config()
        return cls(client.AppsV1Api(), namespace, deployments)

    def replicas(self, role: str) -> int:
        scale = self.apps_api.read_namespaced_deployment_scale(self.deployments[role], self.namespace)
        return int(scale.spec.replicas or 0)

    def scale(self, role: str, replicas: int) -> None:
        name = self.deployments[role]
        logger.info("scaling deployment %s/%s to %d", self.namespace, name, replicas)
        self.apps_api.patch_namespaced_deployment_scale(name, self.namespace, {"spec": {"replicas": replicas}})
