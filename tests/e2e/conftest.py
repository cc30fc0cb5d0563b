"""Fixtures shared by the end-to-end tests that use the real SmolLM2-135M-Instruct model."""

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from services.launcher.config import InstancePorts
from services.launcher.ports import find_free_port
from services.launcher.supervisor import RestartPolicy
from shared.engine import LLM
from shared.model.default_model import resolve_model
from tests.e2e.shared_stacks import (
    DECODE_BLOCKS, FAULTS_DTYPE, FAULTS_FIXED_ADDRESS, FAULTS_STACK_ARGS, FULL_STRENGTH, HEARTBEAT_TTL_S,
    PREFILL_CHUNK_TOKENS, SharedOnDemand, SharedStack, needed_later,
)
from tests.helpers.stack import StackHarness, make_stack_config, running_stack, running_supervised_stack

# Fixtures of the stacks that several modules share (see shared_stacks.py).
SHARED_STACK_FIXTURES = ("disaggregated_stack", "faults_stack")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "live_instances(**counts): the fewest instances of a role the shared "
                                       "disaggregated stack must run for this test, where fewer than FULL_STRENGTH do")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of one shared stack run one after another, where the first of them was: the
    stack starts once and stops as soon as they are done (never two held at once for nothing)."""
    for name in SHARED_STACK_FIXTURES:
        users = [item for item in items if name in item.fixturenames]
        if users:
            first = items.index(users[0])
            others = [item for item in items if name not in item.fixturenames]
            items[:] = others[:first] + users + others[first:]


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    """The converted SmolLM2-135M-Instruct HF folder (config, float32 safetensors, tokenizer).

    Cached in `$PDSERVE_CACHE_DIR` if set, else `~/.cache/pdserve`; the first run of a fresh
    cache converts the GGUF (about 10 s), later runs reuse it.
    """
    return resolve_model(None)


@pytest.fixture(scope="session")
def served_stack(smollm2_folder, tmp_path_factory) -> Iterator[StackHarness]:
    """One bf16 stack (Redis, gateway with tool_choice "auto" on, one prefill and one decode
    instance with 256 blocks each, publishing KV events on ipc://<run dir>/kv-events (the decode
    instance's suffixed _dp1), the decode one serving the OpenAI API too: --openai-port) shared
    by the modules that only send requests and check that every block comes back; it starts on
    first use and stops at the end of the session. Modules that kill processes, change flags or
    count cache hits start their own."""
    run_dir = tmp_path_factory.mktemp("served_stack")
    yield from running_stack(smollm2_folder, "bfloat16", num_prefill=1, num_decode=1, run_dir=run_dir,
                             kv_events_endpoint=f"ipc://{run_dir}/kv-events",
                             extra_args={"instance": ["--num-blocks", "256"], "decode": ["--openai-port", "0"],
                                         "gateway": ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]})


@pytest.fixture(scope="session")
def shared_disaggregated_stack(smollm2_folder, tmp_path_factory) -> Iterator[SharedStack]:
    """Redis, a gateway, 2 prefill and 2 decode instances (bf16, 256 blocks each, DECODE_BLOCKS
    on the decode instances, prompts in PREFILL_CHUNK_TOKENS steps, heartbeats every 0.5 s with a
    HEARTBEAT_TTL_S TTL) for the test_disaggregated_{generation,failures,kills} modules; tests
    use it through `disaggregated_stack`."""
    shared = SharedStack(lambda: running_stack(
        smollm2_folder, "bfloat16", run_dir=tmp_path_factory.mktemp("disaggregated_stack"), extra_args={
            "instance": ["--num-blocks", "256", "--heartbeat-interval-s", "0.5", "--heartbeat-ttl-s", str(HEARTBEAT_TTL_S)],
            "prefill": ["--max-num-batched-tokens", str(PREFILL_CHUNK_TOKENS)],
            "decode": ["--num-blocks", str(DECODE_BLOCKS)]}))
    yield shared
    shared.stop()


@pytest.fixture
def disaggregated_stack(shared_disaggregated_stack, request) -> Iterator[StackHarness]:
    """The shared disaggregated stack for one test, which may freeze, fill, cut from Redis (and
    undo it) or SIGKILL instances: before the test, 2 prefill and 2 decode instances live (or the
    fewer its live_instances marker names) and registered, a killed one replaced under a new name,
    and no child dead unasked; after it, every block back in every live instance's pool; stopped
    after the last test that uses it."""
    stack = shared_disaggregated_stack.get()
    stack.check_children_alive()
    marker = request.node.get_closest_marker("live_instances")
    stack.ensure_live({**FULL_STRENGTH, **(marker.kwargs if marker else {})})
    yield stack
    stack.wait_all_blocks_free()
    stack.check_children_alive()
    if not needed_later(request, "disaggregated_stack"):
        shared_disaggregated_stack.stop()


@pytest.fixture(scope="session")
def shared_chunked_reference(smollm2_folder) -> Iterator[SharedOnDemand[LLM]]:
    """The offline engine of `chunked_reference`, built once for the modules that use it."""
    def start() -> Iterator[LLM]:
        with LLM(model=str(smollm2_folder), dtype="bfloat16", num_threads=1,
                 max_num_batched_tokens=PREFILL_CHUNK_TOKENS) as llm:
            yield llm

    shared = SharedOnDemand(start)
    yield shared
    shared.stop()


@pytest.fixture
def chunked_reference(shared_chunked_reference, request) -> Iterator[LLM]:
    """The offline engine as the disaggregated stack's instances compute: bf16, one thread,
    prompts in PREFILL_CHUNK_TOKENS steps (bf16 output may depend on the chunking); one for the
    run, shut down after the last test that uses it. Its modules' prompts share no block (a
    prefix-cache hit would change the chunks)."""
    yield shared_chunked_reference.get()
    if not needed_later(request, "chunked_reference"):
        shared_chunked_reference.stop()


@pytest.fixture(scope="session")
def shared_faults_stack(smollm2_folder, tmp_path_factory) -> Iterator[SharedStack]:
    """The supervised fault stack (FAULTS_STACK_ARGS) of test_pool_faults and test_hung_instances;
    tests use it through `faults_stack`."""
    def start() -> Iterator[StackHarness]:
        config = make_stack_config(smollm2_folder, FAULTS_DTYPE, run_dir=tmp_path_factory.mktemp("faults_stack"),
                                   extra_args=FAULTS_STACK_ARGS)
        config.restart_policy = RestartPolicy(initial_backoff_s=0.2, max_backoff_s=1.0)
        config.instance_ports = {name: InstancePorts(find_free_port(), find_free_port())
                                 for name in FAULTS_FIXED_ADDRESS}
        config.__post_init__()  # checks the names and ports
        return running_supervised_stack(config, smollm2_folder)

    shared = SharedStack(start)
    yield shared
    shared.stop()


@pytest.fixture
def faults_stack(shared_faults_stack, request) -> Iterator[StackHarness]:
    """The shared fault stack for one test, which injects one fault (a kill, a SIGTERM, a
    SIGSTOP, a second gateway) and waits until every child is back, registered, and every block
    free (the modules' own autouse fixtures); stopped after the last test that uses it."""
    yield shared_faults_stack.get()
    if not needed_later(request, "faults_stack"):
        shared_faults_stack.stop()


@pytest.fixture
def client(stack) -> Iterator[openai.OpenAI]:
    """The official OpenAI client on the module's `stack` gateway; after the test, every block
    is back in every instance's pool and no process died."""
    http_address = stack.stack.ready_info["gateway"]["http_address"]
    with openai.OpenAI(base_url=f"http://{http_address}/v1", api_key="unused", max_retries=0,
                       timeout=120) as http_client:
        yield http_client
    stack.wait_all_blocks_free()
    stack.check_children_alive()
