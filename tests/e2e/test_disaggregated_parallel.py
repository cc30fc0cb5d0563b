"""Disaggregated serving across different parallel layouts: a pipeline-parallel prefill
instance (PP=2: each stage holds 15 of SmolLM2's 30 layers) feeds a tensor-parallel decode
instance (TP=3: each rank holds one of the 3 KV heads). The prefill engine gathers its stages'
KV into the full layout, the wire carries it unchanged, the decode engine scatters it to its
ranks. fp32: each greedy token must be transformers' argmax for the same prefix; afterwards
every block is back in both pools.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.e2e.test_engine_vs_transformers import assert_greedy_under_teacher_forcing
from tests.helpers.gateway_client import generate, generate_request
from tests.helpers.stack import running_stack

PROMPTS = ["The capital of France is", "Three primary colors are"]
NUM_NEW = 6


@pytest.fixture(scope="module")
def stack(smollm2_folder, tmp_path_factory):
    yield from running_stack(smollm2_folder, "float32", num_prefill=1, num_decode=1,
                             run_dir=tmp_path_factory.mktemp("parallel_stack"), extra_args={
                                 "instance": ["--num-blocks", "64"],
                                 "prefill": ["--pipeline-parallel-size", "2"],
                                 "decode": ["--tensor-parallel-size", "3"]})


def test_prefill_pp2_to_decode_tp3_matches_transformers(stack, smollm2_folder):
    hf_model = AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32).eval()
    for prompt in PROMPTS:
        got = generate(stack.gateway, generate_request(text=prompt, max_tokens=NUM_NEW, ignore_eos=True),
                       timeout_s=240)
        assert len(got.token_ids) == NUM_NEW
        prompt_ids = hf_model_prompt_ids(smollm2_folder, prompt)
        assert_greedy_under_teacher_forcing(hf_model, prompt_ids, list(got.token_ids))
    stack.wait_all_blocks_free()
    stack.check_children_alive()


def hf_model_prompt_ids(folder, prompt: str) -> list[int]:
    from shared.tokenization.tokenizer import encode_prompt, load_tokenizer
    return encode_prompt(load_tokenizer(folder), prompt)
