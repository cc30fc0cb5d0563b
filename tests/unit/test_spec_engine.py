"""Speculative decoding in the engine, on the tiny random Llama (fp32): greedy output is the
non-speculative output, token for token, whatever the proposer, k, batch mix, chunking,
prefix caching or preemption; max_tokens, min_tokens and stops hold exactly.

Proposers: n-gram lookup; a draft made of the target's first layer (often wrong); the
target's two layers as its own draft (always right, so every step accepts all k and adds a
bonus token); another HF folder as the draft. Every test ends with the block pool whole.
"""

import pytest

from shared.engine import LLM, SamplingParams
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture

PROMPTS = [
    [5, 17, 92, 3, 44, 101, 7, 8, 9, 200, 31, 64, 12, 77, 150, 2, 99],
    [11, 12, 13],
    list(range(20, 60)),
    [250, 1, 250, 1, 250, 1, 42],
    [7, 8, 9, 10, 7, 8, 9, 10, 7, 8, 9, 10, 7, 8],
    [3] * 12,
]
NUM_NEW = 16
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True)
NGRAM = dict(speculative_method="ngram")
FIRST_LAYER_DRAFT = dict(speculative_method="draft", draft_num_layers=1)
EXACT_DRAFT = dict(speculative_method="draft", draft_num_layers=2)


def make_llm(folder, num_blocks=96, **kwargs) -> LLM:
    return LLM(model=str(folder), dtype="float32", block_size=4, num_blocks=num_blocks, **kwargs)


def generate_tokens(llm, prompts=PROMPTS, params=GREEDY):
    return [output.outputs[0].token_ids for output in llm.generate(prompts, params)]


def assert_pool_is_whole(llm: LLM):
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks
    assert all(block.ref_count == 0 for block in pool.blocks)


@pytest.fixture(scope="module")
def plain_llm(tiny_llama_folder):
    return make_llm(tiny_llama_folder)


@pytest.fixture(scope="module")
def reference_tokens(plain_llm):
    return generate_tokens(plain_llm)


@pytest.mark.parametrize("spec", [NGRAM, FIRST_LAYER_DRAFT, EXACT_DRAFT], ids=["ngram", "draft1", "exact"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculation_gives_the_non_speculative_tokens(tiny_llama_folder, reference_tokens, spec, k):
    llm = make_llm(tiny_llama_folder, num_speculative_tokens=k, **spec)
    assert generate_tokens(llm) == reference_tokens
    stats = llm.engine.core.spec_stats
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0
    assert len(stats.proposed_per_position) == k
    if spec is EXACT_DRAFT:
        assert stats.num_accepted_tokens == stats.num_draft_tokens
    assert_pool_is_whole(llm)


def test_another_hf_folder_works_as_the_draft(tiny_llama_folder, tiny_llama_untied_folder, reference_tokens):
    llm = make_llm(tiny_llama_folder, speculative_method="draft", draft_model=str(tiny_llama_untied_folder))
    assert generate_tokens(llm) == reference_tokens
    assert llm.engine.core.spec_stats.num_draft_tokens > 0
    assert_pool_is_whole(llm)


def test_exact_draft_emits_k_plus_one_tokens_a_step(tiny_llama_folder, reference_tokens):
    llm = make_llm(tiny_llama_folder, num_speculative_tokens=3, **EXACT_DRAFT)
    engine = llm.engine
    engine.add_request(PROMPTS[0], GREEDY)
    counts = []
    while engine.has_unfinished_requests():
        counts.extend(len(output.outputs[0].delta_token_ids) for output in engine.step())
    # The prompt step samples 1; then 4 per step until max_tokens caps the last draft.
    assert counts == [1, 4, 4, 4, 3] and sum(counts) == NUM_NEW
    assert_pool_is_whole(llm)


@pytest.mark.parametrize("spec", [NGRAM, FIRST_LAYER_DRAFT], ids=["ngram", "draft1"])
def test_mixed_batch_of_speculating_and_plain_requests(tiny_llama_folder, plain_llm, spec):
    """Opted-out, logprobs, short max_tokens and penalized requests share steps with
    speculating ones; each gets exactly what the plain engine gives it."""
    params = [
        GREEDY,
        SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True, use_speculation=False),
        SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True, repetition_penalty=1.5,
                       presence_penalty=0.5, frequency_penalty=0.3),
        SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
    ]
    llm = make_llm(tiny_llama_folder, num_speculative_tokens=3, **spec)
    outputs = llm.generate(PROMPTS, params)
    expected = plain_llm.generate(PROMPTS, params)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in expected]
    assert [lp.logprob for lp in outputs[2].outputs[0].logprobs] == pytest.approx(
        [lp.logprob for lp in expected[2].outputs[0].logprobs], abs=1e-4)
    assert_pool_is_whole(llm)


@pytest.mark.parametrize("spec", [NGRAM, FIRST_LAYER_DRAFT], ids=["ngram", "draft1"])
def test_tiny_prefill_chunks_give_the_same_tokens(tiny_llama_folder, reference_tokens, spec):
    llm = make_llm(tiny_llama_folder, max_num_batched_tokens=6, num_speculative_tokens=3, **spec)
    assert generate_tokens(llm) == reference_tokens
    assert_pool_is_whole(llm)


@pytest.mark.parametrize("spec", [NGRAM, FIRST_LAYER_DRAFT], ids=["ngram", "draft1"])
def test_prefix_cache_holds_only_confirmed_tokens(tiny_llama_folder, plain_llm, reference_tokens, spec):
    """Prompts that extend the first pass's outputs hit blocks computed while speculating
    (rejected slots included): the tokens must still be the plain engine's."""
    llm = make_llm(tiny_llama_folder, num_speculative_tokens=3, **spec)
    assert generate_tokens(llm) == reference_tokens
    extended = [prompt + tokens for prompt, tokens in zip(PROMPTS, reference_tokens)]
    short = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outputs = llm.generate(extended, short)
    assert sum(output.num_cached_tokens for output in outputs) > 0
    assert [o.outputs[0].token_ids for o in outputs] == generate_tokens(plain_llm, extended, short)
    sequences = [prompt + tokens for prompt, tokens in zip(PROMPTS, reference_tokens)]
    sequences += [prompt + o.outputs[0].token_ids for prompt, o in zip(extended, outputs)]
    confirmed_blocks = {tuple(seq[i:i + 4]) for seq in sequences for i in range(0, len(seq) - 3, 4)}
    cached = [block.token_ids for block in llm.engine.core.block_pool.blocks if block.block_hash is not None]
    assert cached and all(token_ids in confirmed_blocks for token_ids in cached)
    assert_pool_is_whole(llm)


@pytest.mark.parametrize("spec", [NGRAM, FIRST_LAYER_DRAFT], ids=["ngram", "draft1"])
def test_preemption_from_a_tiny_cache_gives_the_same_tokens(tiny_llama_folder, reference_tokens, spec):
    llm = make_llm(tiny_llama_folder, num_blocks=20, num_speculative_tokens=3, **spec)
    assert generate_tokens(llm) == reference_tokens
    assert llm.engine.core.scheduler.num_preemptions > 0
    assert_pool_is_whole(llm)


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 7])
def test_max_tokens_is_never_exceeded(tiny_llama_folder, reference_tokens, max_tokens):
    llm = make_llm(tiny_llama_folder, num_speculative_tokens=5, **EXACT_DRAFT)
    [output] = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    assert output.outputs[0].token_ids == reference_tokens[0][:max_tokens]
    assert output.outputs[0].finish_reason == "length"
    assert_pool_is_whole(llm)


def test_generation_stops_at_the_first_stop_token_among_accepted_ones(tiny_llama_folder, reference_tokens):
    tokens = reference_tokens[2]
    index = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True, stop_token_ids=[tokens[index]])
    llm = make_llm(tiny_llama_folder, num_speculative_tokens=5, **EXACT_DRAFT)
    [output] = llm.generate([PROMPTS[2]], params)
    assert output.outputs[0].token_ids == tokens[:index + 1]
    assert (output.outputs[0].finish_reason, output.outputs[0].stop_reason) == ("stop", tokens[index])
    assert_pool_is_whole(llm)


@pytest.mark.parametrize("spec", [NGRAM, EXACT_DRAFT], ids=["ngram", "exact"])
def test_min_tokens_suppresses_stops_at_each_verified_position(tiny_llama_folder, plain_llm,
                                                               reference_tokens, spec):
    tokens = reference_tokens[4]
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True, min_tokens=7,
                            stop_token_ids=[tokens[1], tokens[3]])
    llm = make_llm(tiny_llama_folder, num_speculative_tokens=5, **spec)
    [output] = llm.generate([PROMPTS[4]], params)
    [expected] = plain_llm.generate([PROMPTS[4]], params)
    assert output.outputs[0].token_ids == expected.outputs[0].token_ids
    assert len(output.outputs[0].token_ids) >= 7
    assert_pool_is_whole(llm)


def test_stop_string_drops_the_rest_of_the_step(tiny_llama_folder, plain_llm, smollm2_tokenizer):
    llm = make_llm(tiny_llama_folder, num_speculative_tokens=5, **EXACT_DRAFT)
    for engine in (llm.engine, plain_llm.engine):
        engine.tokenizer = smollm2_tokenizer
        engine.output_processor.tokenizer = smollm2_tokenizer
    try:
        [full] = plain_llm.generate([PROMPTS[2]], GREEDY)
        text = full.outputs[0].text
        stop = text[len(text) // 3: len(text) // 3 + 2]
        params = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True, stop=[stop])
        [output] = llm.generate([PROMPTS[2]], params)
        [expected] = plain_llm.generate([PROMPTS[2]], params)
    finally:
        plain_llm.engine.tokenizer = plain_llm.engine.output_processor.tokenizer = None
    assert output.outputs[0].token_ids == expected.outputs[0].token_ids
    assert len(output.outputs[0].token_ids) < NUM_NEW
    assert (output.outputs[0].text, output.outputs[0].finish_reason) == (expected.outputs[0].text, "stop")
    assert_pool_is_whole(llm)


@pytest.mark.parametrize("spec", [NGRAM, FIRST_LAYER_DRAFT], ids=["ngram", "draft1"])
def test_seeded_sampling_repeats_whatever_the_batch(tiny_llama_folder, spec):
    seeded = SamplingParams(temperature=0.9, top_k=20, max_tokens=NUM_NEW, ignore_eos=True, seed=1234)
    others = SamplingParams(temperature=1.0, max_tokens=NUM_NEW, ignore_eos=True)
    llm = make_llm(tiny_llama_folder, num_speculative_tokens=3, **spec)
    alone = generate_tokens(llm, [PROMPTS[4]], seeded)[0]
    in_batch = llm.generate([PROMPTS[0], PROMPTS[4], PROMPTS[1]], [others, seeded, others])
    assert in_batch[1].outputs[0].token_ids == alone
    assert llm.engine.core.spec_stats.num_drafts > 0
    assert_pool_is_whole(llm)


def test_n_completions_speculate_independently(tiny_llama_folder, plain_llm):
    params = SamplingParams(n=3, temperature=0, max_tokens=NUM_NEW, ignore_eos=True)
    llm = make_llm(tiny_llama_folder, num_speculative_tokens=3, **FIRST_LAYER_DRAFT)
    [output] = llm.generate([PROMPTS[0]], params)
    [expected] = plain_llm.generate([PROMPTS[0]], params)
    assert [c.token_ids for c in output.outputs] == [c.token_ids for c in expected.outputs]
    assert_pool_is_whole(llm)


def test_abort_mid_speculation_frees_every_block(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder, num_speculative_tokens=5, **EXACT_DRAFT)
    engine = llm.engine
    request_id = engine.add_request(PROMPTS[2], GREEDY)
    for _ in range(3):
        engine.step()
    assert engine.abort_request(request_id).finished
    assert_pool_is_whole(llm)
