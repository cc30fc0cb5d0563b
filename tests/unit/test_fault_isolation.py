"""One request's failure never reaches another: per-request fault isolation in the engine.

A failure injected for one request (sampling, guided mask, speculation, output processing)
finishes that request alone with finish reason "error"; the other requests of the same batch
get exactly the tokens of a clean run, and every KV block is back in the pool. A failure of
the step as a whole (the forward pass) still raises. Tiny random Llama, fp32.
"""

import pytest

import shared.sampling.sampler as sampler_module
from shared.engine import SamplingParams
from shared.engine.output_processor import OutputProcessor
from tests.unit.test_engine import assert_pool_is_whole, make_llm

PROMPTS = [[5, 17, 92, 3, 44, 101, 7, 8], [11, 12, 13], list(range(20, 40)), [250, 1, 250, 1, 42]]
POISON_SEED = 4242


def params_for(index: int, temperature: float) -> SamplingParams:
    """Request 1 carries the seed that `poison_rows_with_seed` makes fail; the others their own."""
    seed = POISON_SEED if index == 1 else index
    return SamplingParams(temperature=temperature, max_tokens=6, ignore_eos=True, seed=seed)


@pytest.fixture
def clean_tokens(tiny_llama_folder):
    def run(temperature: float) -> list[list[int]]:
        llm = make_llm(tiny_llama_folder)
        params = [params_for(i, temperature) for i in range(len(PROMPTS))]
        return [output.token_ids for output in llm.generate(PROMPTS, params)]
    return run


def poison_rows_with_seed(monkeypatch, seed: int = POISON_SEED, after_tokens: int = 2):
    """Make the sampler raise for any batch holding a row seeded `seed` once that row has
    `after_tokens` output tokens (a bug that hits one request mid-generation)."""
    real = sampler_module.Sampler.__call__

    def failing(self, logits, rows):
        if any(row.params.seed == seed and len(row.output_token_ids) >= after_tokens for row in rows):
            raise IndexError("index -1 is out of bounds (injected)")
        return real(self, logits, rows)
    monkeypatch.setattr(sampler_module.Sampler, "__call__", failing)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_sampling_failure_finishes_only_its_request(tiny_llama_folder, clean_tokens, monkeypatch, temperature):
    expected = clean_tokens(temperature)
    poison_rows_with_seed(monkeypatch)
    llm = make_llm(tiny_llama_folder)
    params = [params_for(i, temperature) for i in range(len(PROMPTS))]
    outputs = llm.generate(PROMPTS, params)
    bad = outputs[1].outputs[0]
    assert bad.finish_reason == "error"
    assert "sampling failed" in bad.error and "injected" in bad.error
    assert bad.token_ids == expected[1][:2]
    for index in (0, 2, 3):
        assert outputs[index].outputs[0].finish_reason == "length"
        assert outputs[index].token_ids == expected[index]
    assert_pool_is_whole(llm)
    # The engine keeps serving.
    assert llm.generate(PROMPTS[0], params_for(0, temperature))[0].token_ids == expected[0]


def test_a_failure_in_output_processing_finishes_only_its_request(tiny_llama_folder, clean_tokens, monkeypatch):
    expected = clean_tokens(0.0)
    real = OutputProcessor._add_new_tokens

    def failing(state, core_output):
        if core_output.request_id == "poisoned" and len(state.output.token_ids) >= 2:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return real(state, core_output)
    monkeypatch.setattr(OutputProcessor, "_add_new_tokens", staticmethod(failing))
    llm = make_llm(tiny_llama_folder)
    params = [params_for(i, 0.0) for i in range(len(PROMPTS))]
    request_ids = [llm.engine.add_request(prompt, p, request_id="poisoned" if i == 2 else None)
                   for i, (prompt, p) in enumerate(zip(PROMPTS, params))]
    outputs = llm._run(request_ids)
    assert outputs[2].outputs[0].finish_reason == "error"
    assert "output processing failed" in outputs[2].outputs[0].error
    assert [outputs[i].token_ids for i in (0, 1, 3)] == [expected[i] for i in (0, 1, 3)]
    assert_pool_is_whole(llm)


def test_a_forward_pass_failure_fails_the_step(tiny_llama_folder, monkeypatch):
    llm = make_llm(tiny_llama_folder)

    def broken(*args, **kwargs):
        raise RuntimeError("worker died (injected)")
    monkeypatch.setattr(llm.engine.core.executor.runner, "model", broken)
    with pytest.raises(RuntimeError, match="worker died"):
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=2))
    assert_pool_is_whole(llm)


@pytest.mark.parametrize("stage", ["propose", "verify"])
def test_a_speculation_failure_finishes_only_its_request(tiny_llama_folder, clean_tokens, stage):
    expected = clean_tokens(0.0)
    llm = make_llm(tiny_llama_folder, speculative_method="draft", draft_num_layers=2, num_speculative_tokens=2)
    speculator = llm.engine.core.executor.runner.speculator
    real = getattr(speculator, stage)

    def failing(items, *args):
        if any(item.request_id == "poisoned" for item in items):
            raise RuntimeError(f"{stage} broke (injected)")
        return real(items, *args)
    setattr(speculator, stage, failing)
    params = [params_for(i, 0.0) for i in range(len(PROMPTS))]
    request_ids = [llm.engine.add_request(prompt, p, request_id="poisoned" if i == 0 else None)
                   for i, (prompt, p) in enumerate(zip(PROMPTS, params))]
    outputs = llm._run(request_ids)
    assert outputs[0].outputs[0].finish_reason == "error" and "injected" in outputs[0].outputs[0].error
    assert [outputs[i].token_ids for i in (1, 2, 3)] == [expected[i] for i in (1, 2, 3)]
    assert llm.engine.core.spec_stats.num_draft_tokens > 0
    assert_pool_is_whole(llm)
