"""Peer churn: an instance killed (kill -9) and restarted on the same address, again and again,
while streams run (bench-faults' "same-address churn" scenarios, tests/e2e/test_peer_churn.py).

What breaks disaggregated systems here is what the survivors keep about the dead peer: cached
connections to its old incarnation, buffers of transfers it abandoned, memory that grows with
every cycle. So each cycle is verified as a kill -9 is (a new pid, a restart, registered again)
and, in addition, the new incarnation's gRPC and UCX addresses are the old ones; and the
survivors' transport state (`TransportState`, from their /metrics) is read before and after.
"""

import json
import os
import re
import signal
import time
import urllib.request
from dataclasses import dataclass

from benchmarks.chaos_faults import num_restarts
from benchmarks.chaos_stack import registered_ids
from benchmarks.harness import fault_checks
from benchmarks.harness.fault_evidence import Check, FaultEvidence
from benchmarks.harness.fault_checks import ProcessIdentity

# Gauges of an instance's KV transport (services/observability/instance_metrics.py) and its RSS.
GAUGES = {"idle_endpoints": "pdserve:kv_transfer_idle_endpoints",
          "idle_addresses": "pdserve:kv_transfer_idle_addresses",
          "lingering": "pdserve:kv_transfer_lingering_operations",
          "rss_bytes": "process_resident_memory_bytes"}


@dataclass(frozen=True)
class TransportState:
    """One instance's KV transport and memory, as its /metrics shows them."""

    idle_endpoints: int
    idle_addresses: int
    lingering: int
    rss_bytes: int


def transport_state(metrics_address: str) -> TransportState:
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read().decode()

    def gauge(name: str) -> int:
        found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        if found is None:
            raise ValueError(f"{metrics_address}/metrics has no {name}")
        return int(float(found.group(1)))
    return TransportState(**{field: gauge(name) for field, name in GAUGES.items()})


def survivors_state(stack, survivors: list[str]) -> dict[str, TransportState]:
    """Each survivor's TransportState (its /metrics address from its current ready file)."""
    children = {child.name: child for child in stack.instances}
    return {name: transport_state(ready_info_of(children[name])["metrics_address"]) for name in survivors}


def ready_info_of(child) -> dict | None:
    """The child's ready file (removed at each start), None before its process has written it."""
    try:
        return json.loads(child.ready_file.read_text())
    except (OSError, ValueError):
        return None


def addresses_of(child) -> tuple[str, str] | None:
    """(gRPC, UCX) address of the child's current process, None before it is ready."""
    ready = ready_info_of(child)
    return (ready["grpc_address"], ready["ucx_address"]) if ready else None


def kill_and_restart_in_place(stack, name: str, timeout_s: float = 300.0) -> FaultEvidence:
    """kill -9 the instance `name`, wait until the supervisor restarted it and it registered
    again; evidence: the old pid gone, a new one, the restart count, registered, same address."""
    child = next(child for child in stack.instances if child.name == name)
    before, old, restarts_before = addresses_of(child), ProcessIdentity.of(child.pid), num_restarts(stack, name)
    os.kill(old.pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (
            num_restarts(stack, name) > restarts_before and addresses_of(child) is not None
            and name in registered_ids(stack)):
        time.sleep(0.1)
    after = addresses_of(child)
    return FaultEvidence("kill -9, restarted on the same address", name, [
        *fault_checks.replaced(name, old, child.pid),
        fault_checks.restarted(name, restarts_before, num_restarts(stack, name)),
        fault_checks.registered({c.name for c in stack.instances}, registered_ids(stack)),
        Check(f"{name} back on the same gRPC and UCX address", f"{before} -> {after}",
              before is not None and after == before)])


def leftovers(before: dict[str, TransportState], after: dict[str, TransportState],
              num_receivers: int) -> list[str]:
    """What the survivors kept of the churned peer: lingering transport operations, cached
    connections to more receiver addresses than there are receivers. Empty when nothing."""
    found = []
    for name, state in after.items():
        if state.lingering:
            found.append(f"{name}: {state.lingering} lingering transport operation(s)")
        if state.idle_addresses > num_receivers:
            found.append(f"{name}: cached connections to {state.idle_addresses} addresses "
                         f"({num_receivers} receivers run)")
    return found


def rss_growth_mib(before: dict[str, TransportState], after: dict[str, TransportState]) -> dict[str, float]:
    return {name: (after[name].rss_bytes - before[name].rss_bytes) / 2**20 for name in after}
