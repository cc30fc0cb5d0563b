"""Hung, not dead: an instance's whole process tree (service and engine core) SIGSTOPped under
streaming load, with real processes, Redis, gRPC and UCX (2 prefill + 2 decode instances and a
gateway whose hang timeouts are set small). Each test keeps the victim stopped until every
stream of the load has ended, so a request that needed the victim to resume would show up as
failed or unfinished; then it continues the victim and checks that every block comes back on
every instance (the resumed instance finds its streams' calls cancelled and frees them).

A decode instance stopped mid-stream: its streams migrate and the greedy tokens equal an
unfaulted run (fp32). A prefill instance stopped mid-prompt: the prompts move to the other
one. Redis stopped: nothing fails. A second gateway stopped: the first serves on, and the
stopped one's reservations and streams on the instances are freed while it is still stopped.
"""

import fcntl
import os

import grpc
import pytest

from benchmarks.fault_load import StreamingLoad, failures
from benchmarks.fault_pull import metric_sum, scrape
from services.launcher.child import stop_children
from shared.pb.pdserve.v1 import gateway_pb2_grpc
from tests.e2e.test_pool_faults import gateway_count, start_second_gateway
from tests.helpers.freeze import Frozen
from tests.helpers.gateway_client import generate, generate_request, random_token_ids
from tests.helpers.stack import StackHarness


@pytest.fixture
def stack(faults_stack):
    """The supervised fault stack of tests/e2e/conftest.py, shared with test_pool_faults (settings,
    the hang timeouts among them, in shared_stacks.py)."""
    return faults_stack


@pytest.fixture(autouse=True)
def healthy_after(stack):
    """Every instance registered, none restarted (a stopped process is not a dead one), every
    block free, after each test."""
    restarts_before = restart_counts(stack)
    yield
    names = {child.name for child in stack.stack.instances}
    stack.wait_for(lambda: stack.registered_ids() == names, 60.0, "every instance registered again")
    assert restart_counts(stack) == restarts_before
    stack.wait_all_blocks_free()


def restart_counts(stack: StackHarness) -> dict[str, int]:
    """Restarts so far of every child (the supervisor lists a child once it has checked it)."""
    counts = {record.name: record.num_restarts for record in stack.stack.supervisor.records()}
    return {child.name: counts.get(child.name, 0) for child in stack.stack.children()}


def child_named(stack: StackHarness, name: str):
    return next(child for child in stack.stack.children() if child.name == name)


def busy_instance(stack: StackHarness, role: str, field: str) -> str:
    """The first instance of `role` whose status shows `field` > 0 (a slow status answer on a
    busy machine is asked again)."""
    def find() -> str | None:
        try:
            return next((name for name, status in stack.statuses(role).items() if getattr(status, field) > 0), None)
        except grpc.RpcError:
            return None
    return stack.wait_for(find, 120.0, f"a busy {role} instance", 0.02)


def test_a_decode_stopped_mid_stream_has_its_streams_migrated_with_the_same_tokens(stack):
    request = generate_request(token_ids=random_token_ids(100, seed=21), max_tokens=40, ignore_eos=True)
    expected = generate(stack.gateway, request)
    migrated = gateway_count(stack, "pdserve:migrations_total", reason="hung")
    tokens, usage, frozen = [], None, None
    try:
        for message in stack.gateway.Generate(request, timeout=180):
            tokens.extend(message.token_ids)
            usage = message.usage if message.HasField("usage") else usage
            if frozen is None and len(tokens) >= 8:
                victim = busy_instance(stack, "decode", "num_running")
                frozen = Frozen(child_named(stack, victim)).__enter__()
        assert frozen is not None
        assert tokens == expected.token_ids  # finished while the victim was still stopped
        assert (usage.prompt_tokens, usage.completion_tokens) == (100, 40)
        assert gateway_count(stack, "pdserve:migrations_total", reason="hung") > migrated
    finally:
        if frozen is not None:
            frozen.thaw()


def test_a_decode_stopped_under_load_loses_no_request(stack):
    with StreamingLoad(stack.gateway, 6, 4, seed=22, max_tokens=48) as load:
        load.wait_in_flight(2)
        with Frozen(child_named(stack, busy_instance(stack, "decode", "num_running"))):
            results = load.results()
    assert failures(results) == []


def test_a_prefill_stopped_mid_prompt_has_its_prompts_moved(stack):
    hung = gateway_count(stack, "pdserve:gateway_hung_instances_total")
    with StreamingLoad(stack.gateway, 4, 4, seed=23, prompt_tokens=600, max_tokens=8) as load:
        with Frozen(child_named(stack, busy_instance(stack, "prefill", "num_running"))):
            results = load.results()
    assert failures(results) == []
    assert gateway_count(stack, "pdserve:gateway_hung_instances_total") > hung


def test_a_host_tier_lock_held_by_a_stopped_process_holds_up_no_request(stack):
    """As when an instance is stopped while it holds the host tier's lock (`flock`): the others
    pass the tier over once its patience runs out (a miss, a skipped store; counted) instead of
    waiting for the lock. Before, both decode instances answered no Reserve for 40 s while a
    prefill instance was stopped (2026-12-08)."""
    local = stack.stack
    [arena_file] = (local.run_dir / "kv-tier").glob("*.host")
    skipped_before = tier_busy_skips(local)
    held_by_the_test = os.open(arena_file, os.O_RDWR)  # its own flock, as a stopped process's
    fcntl.flock(held_by_the_test, fcntl.LOCK_EX)
    try:
        with StreamingLoad(stack.gateway, 4, 4, seed=27, max_tokens=8, timeout_s=120) as load:
            results = load.results()
    finally:
        os.close(held_by_the_test)
    assert failures(results) == []
    assert tier_busy_skips(local) > skipped_before


def tier_busy_skips(local) -> float:
    return sum(metric_sum(scrape(local, child.name), "pdserve:kv_tier_busy_skips") for child in local.instances)


def test_redis_stopped_under_load_loses_no_request(stack):
    with StreamingLoad(stack.gateway, 6, 4, seed=24, max_tokens=32) as load:
        load.wait_in_flight(2)
        with Frozen(child_named(stack, "redis")):
            results = load.results()
    assert failures(results) == []


def test_a_stopped_gateways_work_is_freed_while_the_other_gateway_serves(stack):
    """Gateway B is stopped with reservations and streams on the instances: gateway A's requests
    all succeed, and B's blocks come back while B is still stopped (leases it no longer renews,
    streams that run to their end); once continued, B's clients get an answer or an error."""
    second, address = start_second_gateway(stack)
    try:
        with grpc.insecure_channel(address) as channel:
            stopped_gateway = gateway_pb2_grpc.GatewayStub(channel)
            with StreamingLoad(stopped_gateway, 2, 2, seed=25, prompt_tokens=600, max_tokens=16,
                               timeout_s=120) as load_b:
                stack.wait_for(lambda: any(s.num_reserved for s in stack.statuses("decode").values()), 60.0,
                               "a reservation by gateway B", 0.02)
                with Frozen(second):
                    with StreamingLoad(stack.gateway, 4, 2, seed=26, max_tokens=16) as load_a:
                        assert failures(load_a.results()) == []
                    stack.wait_all_blocks_free(timeout_s=60.0)
                assert all(result.ended_at > 0 for result in load_b.results())
    finally:
        stop_children([second], 10.0)

