"""Deterministic mode end to end: the disaggregated stack (real SmolLM2, bfloat16, one prefill
and one decode instance started with `--deterministic`, KV over UCX) gives exactly the offline
engine's output with `deterministic=True`, for prompts sent all at once (the decode instance
batches them, the prefill instance may chunk them) and for a prompt whose prefix the prefill
instance already holds. Without the mode, bf16 output may differ with the batch.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from shared.engine import LLM, SamplingParams
from tests.helpers.gateway_client import generate, generate_request
from tests.helpers.stack import running_stack

DTYPE = "bfloat16"
MAX_TOKENS = 48
SHARED_PREFIX = "You are a careful assistant who answers in full sentences and explains each step. " * 4
PROMPTS = [
    "Why is the sky blue?",
    "Write a short poem about autumn leaves falling in the park.",
    "def quicksort(items):",
    SHARED_PREFIX + "What is the boiling point of water?",
    "List three reasons to learn a second language.",
    SHARED_PREFIX + "How do airplanes stay in the air?",
]


@pytest.fixture(scope="module")
def stack(smollm2_folder, tmp_path_factory):
    yield from running_stack(smollm2_folder, DTYPE, num_prefill=1, num_decode=1,
                             run_dir=tmp_path_factory.mktemp("deterministic_stack"),
                             extra_args={"instance": ["--num-blocks", "512", "--deterministic"],
                                         "prefill": ["--max-num-batched-tokens", "64"]})


@pytest.fixture(scope="module")
def offline(smollm2_folder) -> list[list[int]]:
    """Each prompt alone through the offline engine in deterministic mode, one whole-prompt step."""
    llm = LLM(model=str(smollm2_folder), dtype=DTYPE, num_threads=1, deterministic=True)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [llm.generate([prompt], params)[0].outputs[0].token_ids for prompt in PROMPTS]


def test_concurrent_requests_through_the_stack_equal_the_offline_output(stack, offline):
    def send(prompt: str) -> list[int]:
        request = generate_request(text=prompt, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        return generate(stack.gateway, request, timeout_s=300.0).token_ids

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(send, PROMPTS))
    assert got == offline
    # Again: the shared prefix (and every earlier prompt) is now in the prefill instance's cache.
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        assert list(pool.map(send, PROMPTS[::-1])) == offline[::-1]
    stack.wait_all_blocks_free()
