"""Peer churn on the supervised fault stack (tests/e2e/shared_stacks.py): an instance killed
(kill -9) and restarted on the same gRPC and UCX address 3 times, each time under 8 greedy
streams. Nothing fails; each cycle is verified (the old pid gone, a new one, the restart count,
registered, the same address); and the survivors keep nothing of the dead incarnations: no
lingering transport operations, no cached connections to more receivers than run, every block
free. bench-faults runs the same at size (10 cycles under 40 streams, docs/chaos.md)."""

import pytest

from benchmarks.fault_load import StreamingLoad, failures
from benchmarks.harness.peer_churn import kill_and_restart_in_place, leftovers, survivors_state
from tests.e2e.shared_stacks import FAULTS_FIXED_ADDRESS

NUM_CYCLES = 3
STREAMS = 8


@pytest.fixture
def stack(faults_stack):
    return faults_stack


@pytest.mark.parametrize("victim", FAULTS_FIXED_ADDRESS)
def test_an_instance_restarted_on_its_own_address_leaves_nothing_behind(stack, victim):
    local = stack.stack
    names = {child.name for child in local.instances}
    stack.wait_for(lambda: stack.registered_ids() == names, 120.0, "every instance registered")
    survivors = sorted(names - {victim})
    before = survivors_state(local, survivors)
    for cycle in range(NUM_CYCLES):
        with StreamingLoad(stack.gateway, STREAMS, STREAMS, seed=40 + cycle, max_tokens=32) as load:
            load.wait_in_flight(STREAMS // 2)
            evidence = kill_and_restart_in_place(local, victim)
            results = load.results()
        assert evidence.is_verified, "\n".join(evidence.lines())
        assert failures(results) == []
    stack.wait_all_blocks_free()
    num_receivers = sum(child.role == "decode" for child in local.instances)
    stack.wait_for(lambda: leftovers(before, survivors_state(local, survivors), num_receivers) == [], 60.0,
                   "no lingering transfer and no stale cached connection in the survivors")
