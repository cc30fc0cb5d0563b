"""SmolLM2 (9 heads, 3 KV heads, 30 layers) split across worker processes, against transformers.

TP=3 gives each rank 3 query heads and 1 KV head; PP=2 gives each stage 15 layers. In fp32
every greedy token must be transformers' argmax for the same prefix (teacher forcing; a
near-tie is reported as such), and every block returns to the pool. Short prompts, few tokens.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from shared.engine import LLM, SamplingParams
from tests.e2e.test_engine_vs_transformers import assert_greedy_under_teacher_forcing

QUESTIONS = ["Why is the sky blue?", "What is the capital of France?", "List three fruits that are red."]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def hf_model(smollm2_folder):
    return AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32).eval()


@pytest.mark.parametrize("tp,pp", [(3, 1), (1, 2)])
def test_parallel_smollm2_matches_transformers(smollm2_folder, hf_model, tp, pp):
    from shared.tokenization.chat import apply_chat_template
    with LLM(model=str(smollm2_folder), dtype="float32", num_blocks=64,
             tensor_parallel_size=tp, pipeline_parallel_size=pp) as llm:
        prompts = [apply_chat_template(llm.tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
        outputs = llm.generate(prompts, GREEDY)
        for prompt, output in zip(prompts, outputs):
            assert len(output.token_ids) == GREEDY.max_tokens
            assert_greedy_under_teacher_forcing(hf_model, prompt, list(output.token_ids))
        pool = llm.engine.core.block_pool
        assert pool.num_free_blocks == pool.num_blocks
