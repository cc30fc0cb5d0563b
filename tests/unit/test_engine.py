"""The engine end to end on a tiny random-weight Llama (fp32), against transformers.

Every test checks that all KV blocks are back in the free pool when it ends.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from shared.engine import LLM, SamplingParams
from shared.errors import InvalidRequestError

PROMPTS = [
    [5, 17, 92, 3, 44, 101, 7, 8, 9, 200, 31, 64, 12, 77, 150, 2, 99],
    [11, 12, 13],
    list(range(20, 60)),
    [250, 1, 250, 1, 250, 1, 42],
]
NUM_NEW = 8
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def reference_tokens(tiny_llama_folder):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_folder, dtype=torch.float32).eval()
    results = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            for _ in range(NUM_NEW):
                next_id = model(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
            results.append(ids[0, len(prompt):].tolist())
    return results


def make_llm(folder, **kwargs) -> LLM:
    kwargs.setdefault("num_blocks", 64)
    return LLM(model=str(folder), dtype="float32", block_size=4, **kwargs)


def assert_pool_is_whole(llm: LLM):
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks
    assert all(block.ref_count == 0 for block in pool.blocks)


def generate_tokens(llm, prompts=PROMPTS, params=GREEDY):
    return [output.token_ids for output in llm.generate(prompts, params)]


def test_greedy_batch_matches_transformers(tiny_llama_folder, reference_tokens):
    llm = make_llm(tiny_llama_folder)
    assert generate_tokens(llm) == reference_tokens
    assert_pool_is_whole(llm)


def test_one_at_a_time_equals_batched(tiny_llama_folder, reference_tokens):
    llm = make_llm(tiny_llama_folder)
    assert [generate_tokens(llm, [prompt])[0] for prompt in PROMPTS] == reference_tokens
    assert_pool_is_whole(llm)


def test_tiny_prefill_chunks_give_the_same_tokens(tiny_llama_folder, reference_tokens):
    llm = make_llm(tiny_llama_folder, max_num_batched_tokens=6)
    assert generate_tokens(llm) == reference_tokens
    assert_pool_is_whole(llm)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prefix_caching_on_and_off_give_the_same_tokens(tiny_llama_folder, reference_tokens, prefix_caching):
    llm = make_llm(tiny_llama_folder, enable_prefix_caching=prefix_caching)
    generate_tokens(llm)
    outputs = llm.generate(PROMPTS, GREEDY)  # second pass: hits when caching is on
    assert [o.token_ids for o in outputs] == reference_tokens
    assert (outputs[2].num_cached_tokens > 0) == prefix_caching
    assert_pool_is_whole(llm)


def test_preemption_from_a_tiny_cache_gives_the_same_tokens(tiny_llama_folder, reference_tokens):
    llm = make_llm(tiny_llama_folder, num_blocks=16, enable_prefix_caching=False)
    assert generate_tokens(llm) == reference_tokens
    assert llm.engine.core.stats.num_preemptions > 0
    assert_pool_is_whole(llm)


def test_seeded_sampling_reproduces_whatever_the_batch(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=NUM_NEW, ignore_eos=True)
    alone = llm.generate([PROMPTS[0]], seeded)[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=NUM_NEW, ignore_eos=True)
    mixed = llm.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], [other, seeded, other])[1].token_ids
    assert alone == mixed
    assert_pool_is_whole(llm)


def test_n_completions_share_the_prompt_and_differ(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder, enable_prefix_caching=False)
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=NUM_NEW, ignore_eos=True)
    [output] = llm.generate([PROMPTS[2]], params)
    assert [c.index for c in output.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == NUM_NEW for c in output.outputs)
    assert len({tuple(c.token_ids) for c in output.outputs}) > 1
    assert_pool_is_whole(llm)


def test_logprobs_of_greedy_tokens_are_the_top_alternatives(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    [output] = llm.generate([PROMPTS[0]], params)
    completion = output.outputs[0]
    assert len(completion.logprobs) == 4
    for token_id, entry in zip(completion.token_ids, completion.logprobs):
        assert entry.top[0][0] == token_id and entry.top[0][1] == pytest.approx(entry.logprob)
        assert len(entry.top) == 3
    assert len(output.prompt_logprobs) == len(PROMPTS[0]) - 1
    assert all(len(entry.top) == 2 for entry in output.prompt_logprobs)
    assert_pool_is_whole(llm)


def test_abort_frees_blocks_at_once(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    engine = llm.engine
    engine.add_request(PROMPTS[2], GREEDY, request_id="x")
    engine.step()
    assert engine.core.block_pool.num_free_blocks < engine.core.block_pool.num_blocks
    final = engine.abort_request("x")
    assert final.outputs[0].finish_reason == "abort"
    assert_pool_is_whole(llm)
    assert not engine.has_unfinished_requests()


def test_max_tokens_finishes_with_reason_length(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    [output] = llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert output.outputs[0].finish_reason == "length" and len(output.token_ids) == 3


@pytest.mark.parametrize("prompt, params, field", [
    ([], GREEDY, "prompt"),
    ([1, 2, 10**6], GREEDY, "prompt"),
    ([1] * 5000, GREEDY, "prompt"),
    ([1, 2], SamplingParams(max_tokens=10_000), "max_tokens"),
    ([1, 2], SamplingParams(stop_token_ids=[10**6]), "stop_token_ids"),
])
def test_invalid_requests_name_the_field_and_change_nothing(tiny_llama_folder, prompt, params, field):
    llm = make_llm(tiny_llama_folder, num_blocks=8)  # 32 token slots
    with pytest.raises(InvalidRequestError) as error:
        llm.generate([prompt], params)
    assert error.value.field == field
    assert not llm.engine.has_unfinished_requests()
    assert_pool_is_whole(llm)


def test_duplicate_request_id_is_rejected(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    llm.engine.add_request([1, 2], GREEDY, request_id="same")
    with pytest.raises(InvalidRequestError, match="request_id"):
        llm.engine.add_request([1, 2], GREEDY, request_id="same")
    llm.engine.abort_request("same")
    assert_pool_is_whole(llm)
