"""Actuators apply the planner's decision: set a pool's replica count.

`LogActuator` only records the targets (`pdserve serve planner` with no actuator: the
decision is still logged and exported). The local one lives in services.launcher.autoscale,
the Kubernetes one in services.planner.k8s_actuator."""

from typing import Protocol


class Actuator(Protocol):
    def replicas(self, role: str) -> int:
        """Instances the pool has or is getting (what the planner last asked for)."""

    def scale(self, role: str, replicas: int) -> None:
        """Start or drain instances until the pool has `replicas`; returns without waiting."""


class LogActuator:
    def __init__(self, num_prefill: int = 1, num_decode: int = 1):
        self.targets = {"prefill": num_prefill, "decode": num_decode}

    def replicas(self, role: str) -> int:
        return self.targets[role]

    def scale(self, role: str, replicas: int) -> None:
        self.targets[role] = replicas
