"""Pools that fail and shrink without losing requests, with real processes and a real Redis:
2 prefill + 2 decode instances and a gateway, supervised as under `pdserve up` (a child that
exits unasked is restarted). Each test runs a few greedy streaming requests, injects one
fault while they are in flight, and asserts 0 failed requests, the usage counts right, the
victim back and registered, and every block back in every pool. A decode instance killed
mid-stream hands its stream over (migration) and the greedy tokens equal the unmigrated run.
An instance's engine-core child process killed under load is restarted in place: the
instance leaves routing, restarts its core and registers again, and nothing fails.
"""

import contextlib
import os
import signal
import time
from pathlib import Path
import pytest

from services.launcher.child import ChildProcess, stop_children
from services.launcher.commands import child_env, gateway_argv
from services.launcher.readiness import grpc_address_of, wait_until_ready, wait_until_serving
from benchmarks.fault_load import StreamingLoad, failures
from tests.helpers.gateway_client import generate, generate_request, random_token_ids
from tests.unit.metrics_scrape import scrape

NUM_REQUESTS = 6
CONCURRENCY = 4


@pytest.fixture
def stack(faults_stack):
    """The supervised fault stack of tests/e2e/conftest.py (settings in shared_stacks.py)."""
    return faults_stack


@pytest.fixture(autouse=True)
def healthy_after(stack):
    """Every child back, registered and SERVING, every block free, after each test."""
    yield
    names = {child.name for child in stack.stack.instances}
    stack.wait_for(lambda: all(r.state == "running" for r in stack.stack.supervisor.records())
                   and stack.registered_ids() == names, 120.0, "every instance back and registered")
    stack.wait_all_blocks_free()


def restarts(stack, name: str) -> int:
    return next((r.num_restarts for r in stack.stack.supervisor.records() if r.name == name), 0)


def signal_child(stack, name: str, signum: int) -> None:
    child = next(child for child in stack.stack.children() if child.name == name)
    os.kill(child.pid, signum)


def gateway_count(stack, name: str, **labels: str) -> float:
    """The gateway's counter `name` summed over its samples with `labels` (0 before the first):
    tests compare it before and after their fault, as the stack is shared."""
    samples = scrape(stack.stack.ready_info["gateway"]["http_address"])
    return sum(count for (sample_name, sample_labels), count in samples.items()
               if sample_name == name and set(labels.items()) <= sample_labels)


def run_with_fault(stack, fault, seed: int, **load_args) -> None:
    """Start the load, wait until streams are running, inject `fault()`, expect 0 failures."""
    with StreamingLoad(stack.gateway, NUM_REQUESTS, CONCURRENCY, seed=seed, **load_args) as load:
        load.wait_in_flight(2)
        fault()
        results = load.results()
    assert failures(results) == []


def test_prefill_killed_under_pdserve_up_is_restarted_and_nothing_fails(stack):
    before = restarts(stack, "prefill-0")
    # Long prompts computed 64 tokens a step keep the prefill instances busy when the kill lands.
    run_with_fault(stack, lambda: signal_child(stack, "prefill-0", signal.SIGKILL), seed=1,
                   prompt_tokens=400)
    stack.wait_for(lambda: restarts(stack, "prefill-0") == before + 1, 120.0, "prefill-0 restarted")


def test_redis_killed_and_restarted_costs_nothing(stack):
    def fault():
        signal_child(stack, "redis", signal.SIGKILL)
        stack.wait_for(lambda: restarts(stack, "redis") >= 1, 30.0, "redis restarted")

    run_with_fault(stack, fault, seed=2)
    names = {child.name for child in stack.stack.instances}
    stack.wait_for(lambda: stack.registered_ids() == names, 5.0, "every instance re-registered")
    # After the restart the prefix index is rebuilt: a prompt just served is found again.
    prompt = random_token_ids(64, seed=99)
    generate(stack.gateway, generate_request(token_ids=prompt, max_tokens=2))
    stack.wait_for(lambda: max(stack.prefix_holders(prompt, names).values()) == 4, 10.0,
                   "the prefix index to show the prompt's 4 blocks")


def test_sigterm_drains_a_prefill_and_nothing_fails(stack):
    before = restarts(stack, "prefill-1")
    run_with_fault(stack, lambda: signal_child(stack, "prefill-1", signal.SIGTERM), seed=3, max_tokens=32)
    stack.wait_for(lambda: restarts(stack, "prefill-1") == before + 1, 120.0, "prefill-1 back after its drain")
    child = next(child for child in stack.stack.instances if child.name == "prefill-1")
    assert "drained: no accepted work left" in child.log_path.read_text()


def test_sigterm_drains_a_decode_hands_back_what_outlasts_the_drain_and_nothing_fails(stack):
    """decode-0 gets SIGTERM while it streams; streams of 160 tokens (several seconds even on a
    fast CPU) outlast its 3 s drain: the rest of each moves elsewhere. While it drains it stays
    in the registry as `draining` (and out of what routing lists)."""
    def sigterm_decode_0_while_it_streams():
        stack.wait_for(lambda: getattr(stack.statuses("decode").get("decode-0"), "num_running", 0) > 0, 60.0,
                       "decode-0 to stream", 0.02)
        signal_child(stack, "decode-0", signal.SIGTERM)
        stack.wait_for(lambda: stack.registered_states().get("decode-0") == "draining", 60.0,
                       "decode-0 registered as draining", 0.02)
        assert "decode-0" not in stack.registered_ids("decode")

    before, drained = restarts(stack, "decode-0"), gateway_count(stack, "pdserve:migrations_total", reason="drain")
    run_with_fault(stack, sigterm_decode_0_while_it_streams, seed=6, max_tokens=160)
    stack.wait_for(lambda: restarts(stack, "decode-0") == before + 1, 120.0, "decode-0 back after its drain")
    log = next(child for child in stack.stack.instances if child.name == "decode-0").log_path.read_text()
    assert "handing it back" in log
    assert gateway_count(stack, "pdserve:migrations_total", reason="drain") > drained


def test_decode_killed_while_holding_reservations_is_replaced_before_the_first_token(stack):
    """The decode instance dies while the prompts it reserved for are still in prefill: the
    gateway reserves on the other one and runs the prefill again toward it."""
    def kill_the_decode_holding_reservations():
        holder = stack.wait_for(lambda: next((name for name, status in stack.statuses("decode").items()
                                              if status.num_reserved > 0), None), 60.0,
                                "a decode instance to hold a reservation", 0.02)
        signal_child(stack, holder, signal.SIGKILL)

    with StreamingLoad(stack.gateway, 3, 3, seed=4, prompt_tokens=600) as load:
        kill_the_decode_holding_reservations()
        results = load.results()
    assert failures(results) == []


def test_decode_killed_mid_stream_migrates_and_the_greedy_tokens_match(stack):
    request = generate_request(token_ids=random_token_ids(100, seed=5), max_tokens=40, ignore_eos=True)
    expected = generate(stack.gateway, request)
    migrated = gateway_count(stack, "pdserve:migrations_total", reason="failure")
    tokens, usage, victim = [], None, None
    for message in stack.gateway.Generate(request, timeout=180):
        tokens.extend(message.token_ids)
        usage = message.usage if message.HasField("usage") else usage
        if victim is None and len(tokens) >= 8:
            victim = next(name for name, status in stack.statuses("decode").items() if status.num_running)
            signal_child(stack, victim, signal.SIGKILL)
    assert victim is not None
    assert tokens == expected.token_ids
    assert (usage.prompt_tokens, usage.completion_tokens) == (100, 40)
    assert gateway_count(stack, "pdserve:migrations_total", reason="failure") > migrated


def start_second_gateway(stack) -> tuple[ChildProcess, str]:
    """Another gateway on the same Redis (ephemeral ports), as a second replica would run."""
    local = stack.stack
    ready_file = local.run_dir / "ready" / "gateway-b.json"
    child = ChildProcess("gateway-b", "gateway", gateway_argv(local.config, local.redis_url, ready_file),
                         local.run_dir / "logs" / "gateway-b.log", ready_file, child_env(local.config))
    child.start()
    deadline = time.monotonic() + 120
    address = grpc_address_of(wait_until_ready(child, deadline, lambda: False))
    wait_until_serving(child, address, deadline, lambda: False)
    return child, address


def test_two_gateways_side_by_side_and_a_dead_ones_reservations_come_back(stack):
    """Gateway A dies (kill -9) with requests in flight; gateway B's requests all succeed and
    A's reservations and streams are freed (leases, cancelled calls); A is restarted."""
    import grpc as grpc_module

    from shared.pb.pdserve.v1 import gateway_pb2_grpc

    second, address = start_second_gateway(stack)
    before = restarts(stack, "gateway")
    try:
        with grpc_module.insecure_channel(address) as channel:
            other = gateway_pb2_grpc.GatewayStub(channel)
            with StreamingLoad(other, 4, 2, seed=7) as load_b, \
                    StreamingLoad(stack.gateway, 2, 2, seed=8, prompt_tokens=600) as load_a:
                stack.wait_for(lambda: any(s.num_reserved for s in stack.statuses("decode").values()), 60.0,
                               "a reservation", 0.02)
                signal_child(stack, "gateway", signal.SIGKILL)
                load_a.results()  # the dead gateway's clients see errors: nothing to assert
                assert failures(load_b.results()) == []
    finally:
        stop_children([second], 10.0)
    stack.wait_for(lambda: restarts(stack, "gateway") == before + 1, 60.0, "gateway restarted")


# ---- the engine core: a child process of each instance, restarted in place -------------------

CORE_MODULE = b"shared.engine.core_process.main"


def engine_core_pid(stack, name: str) -> int | None:
    """The pid of instance `name`'s engine-core child process, if it has one now."""
    child = next(child for child in stack.stack.children() if child.name == name)
    children = [pid for task in Path(f"/proc/{child.pid}/task").iterdir()
                for pid in (task / "children").read_text().split()]
    for pid in children:
        with contextlib.suppress(OSError):
            if CORE_MODULE in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
    return None


def kill_engine_core(stack, name: str) -> int:
    pid = engine_core_pid(stack, name)
    assert pid is not None, f"{name} runs no engine-core process"
    os.kill(pid, signal.SIGKILL)
    return pid


def assert_core_restarted_in_place(stack, name: str, killed_pid: int, instance_restarts: int) -> None:
    """A new core serves, the instance process lived on, registered again and SERVING."""
    stack.wait_for(lambda: engine_core_pid(stack, name) not in (None, killed_pid), 120.0, f"{name}'s new core")
    stack.wait_for(lambda: name in stack.registered_ids(), 60.0, f"{name} registered again")
    assert restarts(stack, name) == instance_restarts
    log = next(child for child in stack.stack.instances if child.name == name).log_path.read_text()
    assert f"engine core process {killed_pid} was killed by SIGKILL" in log
    assert "engine core restarted" in log


def test_prefill_engine_core_killed_under_load_is_restarted_in_place(stack):
    before, killed = restarts(stack, "prefill-0"), []
    run_with_fault(stack, lambda: killed.append(kill_engine_core(stack, "prefill-0")), seed=11, prompt_tokens=400)
    assert_core_restarted_in_place(stack, "prefill-0", killed[0], before)


def test_decode_engine_core_killed_mid_stream_is_restarted_and_streams_move(stack):
    """Streams on the decode instance whose core died fail there with UNAVAILABLE while it is
    NOT_SERVING: the gateway migrates them, and no request fails."""
    victim, killed = None, []

    def kill_a_decoding_core():
        nonlocal victim
        victim = stack.wait_for(lambda: next((name for name, status in stack.statuses("decode").items()
                                              if status.num_running > 0), None), 60.0,
                                "a decode instance decoding", 0.02)
        killed.append(kill_engine_core(stack, victim))

    before = {name: restarts(stack, name) for name in ("decode-0", "decode-1")}
    run_with_fault(stack, kill_a_decoding_core, seed=12, max_tokens=40)
    assert_core_restarted_in_place(stack, victim, killed[0], before[victim])
    # The new core serves: a request later succeeds.
    generate(stack.gateway, generate_request(token_ids=random_token_ids(40, seed=13), max_tokens=4))
