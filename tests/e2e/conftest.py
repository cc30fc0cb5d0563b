"""Fixtures shared by the end-to-end tests that use the real SmolLM2-135M-Instruct model."""

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from shared.model.default_model import resolve_model
from tests.helpers.stack import StackHarness, running_stack


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
    instance with 256 blocks each)
    shared by the modules that only send requests and check that every block comes back; it
    starts on first use and stops at the end of the session. Modules that kill processes,
    change flags or count cache hits start their own."""
    yield from running_stack(smollm2_folder, "bfloat16", num_prefill=1, num_decode=1,
                             run_dir=tmp_path_factory.mktemp("served_stack"),
                             extra_args={"instance": ["--num-blocks", "256"],
                                         "gateway": ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]})


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
