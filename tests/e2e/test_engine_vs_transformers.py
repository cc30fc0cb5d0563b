"""The engine on the real SmolLM2 (fp32) against transformers, token for token.

Every token the engine picks greedily must be transformers' argmax for the same prefix
(teacher forcing), unless transformers itself sees a near-tie there (margin < 1e-3), which
is then asserted explicitly. The same holds for every scheduling mode: one batch, one at a
time, tiny prefill chunks, prefix caching on and off, and preemption from a tiny cache.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from shared.engine import LLM, SamplingParams
from shared.model.loader import load_model
from tests.e2e.paged_forward import prompt_logits

QUESTIONS = [
    "Why is the sky blue?",
    "Write a haiku about autumn leaves.",
    "What is the capital of France?",
    "Explain what a hash table is in two sentences.",
    "List three fruits that are red.",
    "How many legs does a spider have?",
    "Translate 'good morning' into Spanish.",
    "What does a compiler do?",
]
NUM_NEW = 32
NEAR_TIE = 1e-3
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True)

ENGINE_MODES = {
    "one batch": {},
    "tiny prefill chunks": {"max_num_batched_tokens": 16},
    "prefix caching off": {"enable_prefix_caching": False},
    "preemption from a tiny cache": {"num_blocks": 24, "enable_prefix_caching": False},
}


@pytest.fixture(scope="module")
def hf_model(smollm2_folder):
    return AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(smollm2_folder):
    from shared.tokenization.chat import apply_chat_template
    from shared.tokenization.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(smollm2_folder)
    return [apply_chat_template(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]


def assert_greedy_under_teacher_forcing(hf_model, prompt: list[int], generated: list[int]):
    """Each generated token is transformers' argmax given the same prefix, or a near-tie."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1:-1]
    for step, (row, token_id) in enumerate(zip(logits, generated)):
        best = int(row.argmax())
        if best != token_id:
            margin = float(row[best] - row[token_id])
            assert margin < NEAR_TIE, f"step {step}: engine chose {token_id}, transformers {best} by {margin}"


def test_prompt_logits_match_transformers(smollm2_folder, hf_model, prompts):
    model, config = load_model(smollm2_folder, torch.float32)
    for prompt in prompts[:3]:
        ours = prompt_logits(model, config, prompt, block_size=16)
        with torch.no_grad():
            theirs = hf_model(torch.tensor([prompt])).logits[0]
        relative = (ours - theirs).abs().max() / theirs.abs().max()
        assert relative < 1e-4


@pytest.fixture(scope="module")
def one_batch_tokens(smollm2_folder, prompts, hf_model):
    llm = LLM(model=str(smollm2_folder), dtype="float32")
    tokens = [output.token_ids for output in llm.generate(prompts, GREEDY)]
    for prompt, generated in zip(prompts, tokens):
        assert len(generated) == NUM_NEW
        assert_greedy_under_teacher_forcing(hf_model, prompt, generated)
    return tokens


def test_one_batch_is_greedy_under_transformers(one_batch_tokens):
    assert len(one_batch_tokens) == len(QUESTIONS)


@pytest.mark.parametrize("mode", [m for m in ENGINE_MODES if m != "one batch"])
def test_every_scheduling_mode_gives_the_same_tokens(smollm2_folder, prompts, one_batch_tokens, hf_model, mode):
    llm = LLM(model=str(smollm2_folder), dtype="float32", **ENGINE_MODES[mode])
    tokens = [output.token_ids for output in llm.generate(prompts, GREEDY)]
    for prompt, generated in zip(prompts, tokens):
        assert_greedy_under_teacher_forcing(hf_model, prompt, generated)
    assert tokens == one_batch_tokens
    if mode.startswith("preemption"):
        assert llm.engine.core.stats.num_preemptions > 0
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks


def test_one_prompt_at_a_time_and_prefix_hits_give_the_same_tokens(smollm2_folder, prompts, one_batch_tokens):
    llm = LLM(model=str(smollm2_folder), dtype="float32")
    singles = [llm.generate([prompt], GREEDY)[0] for prompt in prompts]
    assert [output.token_ids for output in singles] == one_batch_tokens
    again = llm.generate(prompts[:2], GREEDY)  # the same prompts again: prefix-cache hits
    assert all(output.num_cached_tokens > 0 for output in again)
    assert [output.token_ids for output in again] == one_batch_tokens[:2]
