"""Deterministic mode with LoRA adapters, on the tiny random Llama in bfloat16.

With `deterministic=True` a request's tokens and logprobs are the same bits whether it ran
alone, batched with requests for other adapters and the base model (its adapter's rows more or
fewer, its segment elsewhere in the step), its prompt in chunks, or its prefix found in the
prefix cache. The LoRA deltas run in float32 on fixed row tiles (shared.lora.batch_invariant).
"""

import pytest
import torch

from shared.engine import LLM, LoRARequest, SamplingParams
from shared.lora.batch_invariant import RowTiledLoRALinear, tiled_delta
from shared.lora.layers import LoRALinear, StepAdapters
from shared.model.batch_invariance import ROW_TILE, RowTiled
from tests.helpers.lora_adapters import AdapterSpec, save_peft_adapter

BLOCK_SIZE = 4
PROMPTS = [
    [5, 17, 92, 3, 44, 101, 7, 8, 9, 200, 31, 64, 12, 77, 150, 2, 99, 250, 1, 42],
    [11, 12, 13, 14, 15, 16, 17],
    list(range(20, 50)),
    [250, 1, 250, 1, 250, 33, 34, 35, 36, 37, 38],
    [3] * 12,
]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
SPECS = {
    "attn-r4": AdapterSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj"), seed=11, std=0.3),
    "all-r8": AdapterSpec(rank=8, alpha=8, seed=12, std=0.15, target_modules=(
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
}
# Per prompt: the adapter it runs with (None: the base model); "attn-r4" has several rows.
ADAPTER_OF_PROMPT = ["attn-r4", None, "all-r8", "attn-r4", "attn-r4"]


@pytest.fixture(scope="module")
def lora_requests(tiny_llama_folder, tmp_path_factory) -> list[LoRARequest | None]:
    root = tmp_path_factory.mktemp("deterministic_adapters")
    adapters = {name: LoRARequest(name, index + 1, str(save_peft_adapter(tiny_llama_folder, root / name, spec)))
                for index, (name, spec) in enumerate(SPECS.items())}
    return [adapters[name] if name else None for name in ADAPTER_OF_PROMPT]


def make_llm(folder, **kwargs) -> LLM:
    return LLM(model=str(folder), dtype="bfloat16", block_size=BLOCK_SIZE, num_blocks=128, deterministic=True,
               enable_lora=True, max_lora_rank=8, **kwargs)


def tokens_and_logprobs(outputs) -> list[tuple[list[int], list[float]]]:
    return [(output.outputs[0].token_ids, [entry.logprob for entry in output.outputs[0].logprobs])
            for output in outputs]


def assert_pool_is_whole(llm: LLM) -> None:
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks


@pytest.fixture(scope="module")
def each_alone(tiny_llama_folder, lora_requests):
    llm = make_llm(tiny_llama_folder)
    results = [tokens_and_logprobs(llm.generate([prompt], GREEDY, lora_request=lora))[0]
               for prompt, lora in zip(PROMPTS, lora_requests)]
    base = tokens_and_logprobs(llm.generate([PROMPTS[0]], GREEDY))[0]
    assert results[0] != base, "an adapter that changes nothing tests nothing"
    assert_pool_is_whole(llm)
    return results


@pytest.mark.parametrize("engine_kwargs", [{}, {"max_num_batched_tokens": 6}, {"max_loras": 1}],
                         ids=["batched", "chunked", "one-slot"])
def test_mixed_adapter_batch_equals_each_prompt_alone(tiny_llama_folder, lora_requests, each_alone, engine_kwargs):
    llm = make_llm(tiny_llama_folder, **engine_kwargs)
    outputs = llm.generate(PROMPTS, GREEDY, lora_request=lora_requests)
    assert tokens_and_logprobs(outputs) == each_alone
    assert_pool_is_whole(llm)


def test_prefix_cache_hits_with_adapters_give_the_same_output(tiny_llama_folder, lora_requests, each_alone):
    llm = make_llm(tiny_llama_folder)
    llm.generate(PROMPTS[::-1], GREEDY, lora_request=lora_requests[::-1])
    outputs = llm.generate(PROMPTS, GREEDY, lora_request=lora_requests)
    assert all(output.num_cached_tokens > 0 for output in outputs)
    assert tokens_and_logprobs(outputs) == each_alone
    assert_pool_is_whole(llm)


def test_the_base_projections_are_probed_inside_the_lora_layers(tiny_llama_folder):
    """make_batch_invariant never tiles a whole MLP holding LoRA layers (its tiles would
    renumber the rows the adapters' segments name); the layers' own projections are probed."""
    llm = make_llm(tiny_llama_folder)
    model = llm.engine.core.executor.runner.model
    mlp = model.layers[0].mlp
    assert not isinstance(mlp, RowTiled)
    assert isinstance(mlp.gate_up_proj, RowTiledLoRALinear) and isinstance(mlp.down_proj, RowTiledLoRALinear)


def test_a_rows_tiled_delta_is_the_same_bits_alone_and_among_others():
    generator = torch.Generator().manual_seed(3)
    rows = torch.randn(2 * ROW_TILE + 5, 48, generator=generator).to(torch.bfloat16)
    lora_a, lora_b = torch.randn(8, 48, generator=generator), torch.randn(32, 8, generator=generator)
    together = tiled_delta(rows, lora_a, lora_b)
    assert all(torch.equal(tiled_delta(rows[index:index + 1], lora_a, lora_b)[0], together[index])
               for index in (0, ROW_TILE - 1, ROW_TILE, len(rows) - 1))
    exact = (rows.double() @ lora_a.double().T) @ lora_b.double().T
    torch.testing.assert_close(together.double(), exact, rtol=1e-5, atol=1e-4)


def test_the_row_tiled_layer_adds_what_the_plain_layer_adds():
    """Same segments and weights (rank 4, padded to 8): the deterministic layer's output equals
    the plain one's to float32 rounding; base rows (outside any segment) are untouched."""
    generator = torch.Generator().manual_seed(4)
    base = torch.nn.Linear(16, 12)
    weights = {"q_proj": (torch.randn(4, 16, generator=generator), torch.randn(8, 4, generator=generator)),
               "v_proj": (torch.randn(4, 16, generator=generator), torch.randn(2, 4, generator=generator))}
    step = StepAdapters()
    step.set([(1, 4, 0), (5, 7, 1)])
    plain = LoRALinear(base, 0, ("q_proj", "k_proj", "v_proj"), [8, 2, 2], step, 2)
    tiled = RowTiledLoRALinear(base, 0, ("q_proj", "k_proj", "v_proj"), [8, 2, 2], step, 2, pad_rank=8)
    for layer in (plain, tiled):
        layer.set_slot(0, weights)
        layer.set_slot(1, {"q_proj": weights["q_proj"]})
    x = torch.randn(8, 16, generator=generator)
    with torch.no_grad():
        expected, got = plain(x), tiled(x)
        torch.testing.assert_close(got, expected)
        assert torch.equal(got[[0, 4, 7]], base(x)[[0, 4, 7]])
        assert not torch.equal(got[1:4], base(x)[1:4])
