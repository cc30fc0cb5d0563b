"""Every numeric sampling parameter at its edges: refused at admission naming the field, or
sampled robustly (a token inside the vocabulary, the batch's other request unchanged).

The reported case: top_p=1e-300 (inside (0, 1]) rounds to 0 in float32 and indexed -1 in
the top-p threshold; repetition_penalty=1e-300 divided logits by 0. Tiny random Llama, fp32.
"""

import math

import pytest

from shared.engine import LLM, SamplingParams
from shared.errors import InvalidRequestError

VOCAB_SIZE = 256
PROMPT = [7, 7, 7, 9, 9, 3, 3, 3, 3, 12]  # repeated tokens, so penalties touch something
NEIGHBOUR = [11, 12, 13, 14]
NEIGHBOUR_PARAMS = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
DENORMAL = 5e-324

ROBUST = [
    ("top_p", 1e-300), ("top_p", DENORMAL), ("top_p", 1e-45), ("top_p", 1.0),
    ("temperature", 1e-300), ("temperature", 1e-5), ("temperature", 1.5e-5), ("temperature", 1e30),
    ("temperature", 1e300),
    ("repetition_penalty", 1e-300), ("repetition_penalty", DENORMAL), ("repetition_penalty", 1e-45),
    ("repetition_penalty", 1e38), ("repetition_penalty", 1e300),
    ("min_p", 1e-300), ("min_p", DENORMAL), ("min_p", 1.0),
    ("top_k", 1), ("top_k", VOCAB_SIZE - 1), ("top_k", VOCAB_SIZE), ("top_k", 10**9), ("top_k", 2**62), ("top_k", -1),
    ("presence_penalty", 2.0), ("presence_penalty", -2.0), ("frequency_penalty", 2.0), ("frequency_penalty", -2.0),
    ("frequency_penalty", DENORMAL),
    ("seed", 0), ("seed", -1), ("seed", 2**63 - 1), ("seed", 2**64 + 5), ("seed", -2**70),
    ("logprobs", 0), ("logprobs", 20), ("max_tokens", 10**12),
]
REFUSED = [
    ("top_p", 0.0), ("top_p", -DENORMAL), ("top_p", 1.0000001), ("top_p", math.nan), ("top_p", math.inf),
    ("temperature", -1e-300), ("temperature", math.nan), ("temperature", math.inf),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", math.nan),
    ("repetition_penalty", math.inf),
    ("min_p", -DENORMAL), ("min_p", 1.0000001), ("min_p", math.nan),
    ("top_k", -2), ("top_k", 1.5),
    ("presence_penalty", 2.0000001), ("presence_penalty", math.nan), ("frequency_penalty", -math.inf),
    ("seed", 1.0), ("logprobs", -1), ("logprobs", 21), ("max_tokens", 0), ("min_tokens", -1),
]


@pytest.fixture(scope="module")
def llm(tiny_llama_folder):
    return LLM(model=str(tiny_llama_folder), dtype="float32", block_size=4, num_blocks=64)


@pytest.fixture(scope="module")
def neighbour_tokens(llm):
    return llm.generate(NEIGHBOUR, NEIGHBOUR_PARAMS)[0].token_ids


def edge_params(field: str, value) -> SamplingParams:
    kwargs = dict(temperature=1.0, max_tokens=4, ignore_eos=True, seed=3)
    if field == "max_tokens":
        kwargs["max_tokens"] = value
    else:
        kwargs[field] = value
    return SamplingParams(**kwargs)


@pytest.mark.parametrize("field, value", ROBUST, ids=[f"{f}={v!r}" for f, v in ROBUST])
def test_edge_values_sample_inside_the_vocabulary(llm, neighbour_tokens, field, value):
    params = edge_params(field, value)
    edge, neighbour = llm.generate([PROMPT, NEIGHBOUR], [params, NEIGHBOUR_PARAMS])
    completion = edge.outputs[0]
    assert completion.finish_reason == "length", completion.error
    assert completion.token_ids and all(0 <= token < VOCAB_SIZE for token in completion.token_ids)
    assert neighbour.token_ids == neighbour_tokens
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks


@pytest.mark.parametrize("field, value", REFUSED, ids=[f"{f}={v!r}" for f, v in REFUSED])
def test_out_of_range_values_are_refused_naming_the_field(field, value):
    with pytest.raises(InvalidRequestError) as caught:
        edge_params(field, value)
    assert caught.value.field == field


def test_a_tiny_top_p_keeps_exactly_the_most_likely_token(llm):
    greedy = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    tiny = llm.generate(PROMPT, SamplingParams(temperature=1.0, top_p=1e-300, max_tokens=4, ignore_eos=True))[0]
    assert tiny.token_ids == greedy.token_ids
