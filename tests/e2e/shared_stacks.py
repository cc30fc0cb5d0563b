"""Stacks that several end-to-end modules share: their settings, and their lifetime (fixtures in
conftest.py). A shared stack starts when the first test asks for it and stops after the last
test of the run that uses it, so that two of them are never held at once for nothing. The
offline reference engines that several modules compare with are shared the same way."""

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import pytest

from tests.helpers.stack import StackHarness

Shared = TypeVar("Shared")

# The disaggregated stack's prefill instances compute prompts in steps of this many tokens, so
# that a cancel, a deadline or a kill lands while a long prompt is half done.
PREFILL_CHUNK_TOKENS = 64
# Its decode instances have few blocks, so that filling one is quick.
DECODE_BLOCKS = 96
# Its instances heartbeat every 0.5 s with this TTL: a killed one drops out of routing within seconds.
HEARTBEAT_TTL_S = 2.0
# What it runs at the start of every test (its fixture replaces killed instances).
FULL_STRENGTH = {"prefill": 2, "decode": 2}

# The supervised fault stack (2 prefill + 2 decode instances and a gateway, restarted when they
# die, as under `pdserve up`) of test_pool_faults and test_hung_instances. fp32: a migrated
# greedy stream must equal the unmigrated one token for token.
FAULTS_DTYPE = "float32"
FAULTS_STACK_ARGS = {
    # A killed instance drops out of routing within seconds; SIGTERM drains for up to 60 s.
    "instance": ["--num-blocks", "256", "--heartbeat-interval-s", "0.5", "--heartbeat-ttl-s", "2",
                 "--drain-timeout-s", "60"],
    # Long prompts take many steps: a kill or a stop lands mid-prompt.
    "prefill": ["--max-num-batched-tokens", "64"],
    # A draining decode instance hands what still runs after 3 s back for migration.
    "decode": ["--drain-timeout-s", "3"],
    # A dead or stopped gateway's reservations come back after 3 s (renewed while prefill runs).
    # A stream silent for 3 s has its instance probed; a probe waits long: on a machine at load 60
    # a live instance answered a health probe late, was taken for hung, and with the other decode
    # instance stopped nothing was left.
    "gateway": ["--lease-s", "3", "--stall-timeout-s", "3", "--health-probe-timeout-s", "10",
                "--control-call-timeout-s", "10"],
}
# Instances of the fault stack on fixed gRPC and UCX ports: restarted, each comes back on the
# same address (test_peer_churn); the others take ephemeral ports.
FAULTS_FIXED_ADDRESS = ("prefill-1", "decode-1")


class SharedOnDemand(Generic[Shared]):
    """One stack (or offline engine) started on first use by `start()` (a running_stack-style
    generator) and stopped by `stop()` (or at the end of the session); started again if a later
    test needs it."""

    def __init__(self, start: Callable[[], Iterator[Shared]]):
        self._start = start
        self._runner: Iterator[Shared] | None = None
        self._harness: Shared | None = None

    def get(self) -> Shared:
        if self._harness is None:
            self._runner = self._start()
            self._harness = next(self._runner)
        return self._harness

    def stop(self) -> None:
        if self._runner is not None:
            self._runner.close()  # the generator's `finally` stops every process
        self._runner = self._harness = None


SharedStack = SharedOnDemand[StackHarness]


def needed_later(request: pytest.FixtureRequest, fixture_name: str) -> bool:
    """Whether a test after this one in the run's order uses the fixture `fixture_name`."""
    items = request.session.items
    later = items[items.index(request.node) + 1:]
    return any(fixture_name in item.fixturenames for item in later)
