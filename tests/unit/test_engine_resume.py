"""Migration in the engine: a request taken over after k tokens generated elsewhere (its prompt
followed by those k tokens, marked as resumed outputs) continues exactly as the local run
would: greedy, seeded sampling and penalties alike. The prefill side samples the (k+1)-th
token, the decode side reserves blocks for prompt + k tokens and goes on; resumed tokens are
never emitted again, and every block comes back."""

import pytest

from shared.engine import LLM, SamplingParams
from shared.errors import InvalidRequestError
from tests.unit.kv_split import run_split
from tests.unit.test_engine_disaggregation import PROMPT, make_llm


def run_resumed(llm: LLM, params: SamplingParams, earlier: list[int]) -> list[int]:
    """Prefill `PROMPT + earlier` (resumed) with its KV sent to a reservation of the same
    engine (both roles), then decode there; the new tokens."""
    return run_split(llm, PROMPT + earlier, params, num_resumed=len(earlier))


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=1.0, top_k=20, seed=7, max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, repetition_penalty=1.5,
                   frequency_penalty=0.5),
])
@pytest.mark.parametrize("num_resumed", [1, 6])
def test_a_resumed_request_continues_like_the_local_run(tiny_llama_folder, params, num_resumed):
    local = make_llm(tiny_llama_folder).generate([PROMPT], params)[0].token_ids
    llm = make_llm(tiny_llama_folder)
    continued = run_resumed(llm, params, local[:num_resumed])
    assert local[:num_resumed] + continued == local
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks


def test_resumed_tokens_count_toward_max_tokens(tiny_llama_folder):
    llm = make_llm(tiny_llama_folder)
    with pytest.raises(InvalidRequestError, match="num_resumed_output_tokens"):
        llm.engine.add_request(PROMPT + [5, 6, 7], SamplingParams(max_tokens=3), num_resumed_output_tokens=3)
    with pytest.raises(InvalidRequestError, match="num_resumed_output_tokens"):
        llm.engine.add_request(PROMPT, SamplingParams(max_tokens=3), num_resumed_output_tokens=len(PROMPT))
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_resumed_guided_request_continues_its_grammar(tiny_llama_folder, temperature):
    """The matcher is advanced over the resumed tokens: the continuation completes the same
    constrained output (a date) as the local run."""
    from tests.unit.test_guided_engine import DATE, make_llm as make_guided_llm
    from shared.guided import GuidedDecodingParams

    params = SamplingParams(temperature=temperature, seed=3, max_tokens=40,
                            guided=GuidedDecodingParams(regex=DATE))
    prompt = [5, 17, 92, 3, 44, 101, 7, 8]
    local = make_guided_llm(tiny_llama_folder).generate([prompt], params)[0].outputs[0]
    llm = make_guided_llm(tiny_llama_folder)
    engine = llm.engine
    engine.add_request(prompt + local.token_ids[:4], params, request_id="r", num_resumed_output_tokens=4)
    continued = None
    while engine.has_unfinished_requests():
        for output in engine.step():
            continued = output.outputs[0]
    assert local.token_ids[:4] + continued.token_ids == local.token_ids
    assert continued.finish_reason == local.finish_reason
    pool = engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks
