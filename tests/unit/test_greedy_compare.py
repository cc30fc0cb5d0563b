"""The near-tie comparison the bf16 e2e tests use can fail: a divergence where the reference
clearly prefers its token is an error; equal outputs pass. Tiny random Llama, fp32."""

import pytest
import torch
from transformers import LlamaForCausalLM as HFLlamaForCausalLM

from shared.engine import LLM, SamplingParams
from tests.helpers.greedy_compare import assert_greedy_agrees, first_difference, logprob_gap

PROMPT = [5, 17, 92, 3, 44, 101, 7, 8]


@pytest.fixture(scope="module")
def reference(tiny_llama_folder):
    return LLM(model=str(tiny_llama_folder), dtype="float32", block_size=4, num_blocks=64)


def test_equal_outputs_agree_and_a_clear_preference_does_not(reference):
    expected = reference.generate(PROMPT, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0].token_ids
    assert_greedy_agrees(reference, PROMPT, list(expected), expected)
    [output] = reference.generate([PROMPT + expected[:2]], SamplingParams(temperature=0, max_tokens=1, logprobs=20))
    worst = output.outputs[0].logprobs[0].top[-1][0]  # the 20th most likely: far from a tie
    diverged = expected[:2] + [worst] + expected[3:]
    assert logprob_gap(reference, PROMPT + expected[:2], worst, expected[2]) > 0.5
    with pytest.raises(AssertionError, match="part at position 2"):
        assert_greedy_agrees(reference, PROMPT, diverged, expected)


def test_gap_is_measured_for_tokens_far_down_the_ranking(reference, tiny_llama_folder):
    """Guided decoding chooses among the tokens its grammar allows, which the model may rank
    anywhere: the gap between the 100th and 101st most likely is scored, not taken as infinite."""
    hf = HFLlamaForCausalLM.from_pretrained(tiny_llama_folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logprobs = torch.log_softmax(hf(torch.tensor([PROMPT])).logits[0, -1].double(), dim=-1)
    ranked = logprobs.argsort(descending=True).tolist()
    low_a, low_b = ranked[100], ranked[101]
    expected = abs(logprobs[low_a] - logprobs[low_b]).item()
    assert logprob_gap(reference, PROMPT, low_a, low_b) == pytest.approx(expected, abs=1e-4)
    assert logprob_gap(reference, PROMPT, low_a, low_a) == 0.0


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
