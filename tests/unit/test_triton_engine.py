"""The engine end to end with the Triton attention backend (under Triton's interpreter off a
GPU) on the tiny fp32 model: greedy tokens match transformers through chunked prefill, mixed
decode + prefill steps and prefix-cache hits, and every KV block comes back. Few tokens: the
interpreter is slow."""

from tests.unit.triton_setup import DEVICE  # noqa: I001  (skips without triton)

from shared.attention.triton_paged import TritonPagedAttention
from shared.engine import SamplingParams
from tests.unit.test_engine import (  # noqa: F401  (reference_tokens is a fixture)
    PROMPTS, assert_pool_is_whole, generate_tokens, make_llm, reference_tokens)

NUM_NEW = 3


def test_greedy_tokens_match_transformers_through_chunks_and_prefix_hits(tiny_llama_folder, reference_tokens):
    llm = make_llm(tiny_llama_folder, device=str(DEVICE), attention_backend="triton", max_num_batched_tokens=16)
    assert isinstance(llm.engine.core.executor.runner.model.attn_backend, TritonPagedAttention)
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True)
    generate_tokens(llm, PROMPTS[:1], SamplingParams(temperature=0, max_tokens=1))
    outputs = llm.generate(PROMPTS[:3], params)
    assert [output.token_ids for output in outputs] == [tokens[:NUM_NEW] for tokens in reference_tokens[:3]]
    assert outputs[0].num_cached_tokens > 0
    assert_pool_is_whole(llm)
