"""Every adapter shape against peft's merged model (tiny random Llama, fp32, greedy).

The shape table covers adapters on any part of the fused projections (q, k or v alone inside
qkv_proj, gate alone inside gate_up_proj, up with down, all seven), ranks 1, 8 and 16 under
max_lora_rank=16 (and two ranks inside one projection, by peft's rank_pattern), alpha unlike r,
and rsLoRA. Each adapter's B is large enough that its greedy output leaves the base model's
within 4 tokens on every prompt (checked on the reference, so no test here can pass by the
adapter doing nothing). pdserve must give peft's merged tokens for each shape alone, beside
base rows and the other shapes in one batch, through the engine core process, with prefill and
decode on two sides of a KV transfer, and on the GPU's delta code (the Triton kernels over
weights zero-padded to max_lora_rank, run here by Triton's interpreter). Adapters that peft computes otherwise (DoRA, QA-LoRA,
aLoRA, ...) or that adapt modules other than the projections are refused when loaded, the
error naming the option.
"""

import asyncio
import json
from pathlib import Path

import pytest

from services.instance.lora_adapters import AdapterTable
import shared.engine.loading as loading
from shared.engine import LLM, LoRARequest, SamplingParams
from shared.engine.core_process.client import CoreProcessClient
from shared.engine_api.client import GenerateRequest
from shared.engine_args import EngineArgs
from shared.errors import InvalidRequestError
from shared.lora import LoRAConfig
from shared.lora.layers import attach_lora
from tests.helpers.lora_adapters import AdapterSpec, merged_greedy, save_peft_adapter
from tests.unit.kv_split import connected_llm, run_split

ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHAPES = {
    "q-r8": AdapterSpec(rank=8, alpha=16, target_modules=("q_proj",), seed=51, std=0.5),
    "k-r1": AdapterSpec(rank=1, alpha=4, target_modules=("k_proj",), seed=52, std=1.0),
    "v-r16": AdapterSpec(rank=16, alpha=8, target_modules=("v_proj",), seed=53, std=0.4),
    "qv-r8": AdapterSpec(rank=8, alpha=16, target_modules=("q_proj", "v_proj"), seed=54, std=0.4),
    "gate-r1": AdapterSpec(rank=1, alpha=3, target_modules=("gate_proj",), seed=55, std=1.0),
    "up-down-r8": AdapterSpec(rank=8, alpha=4, target_modules=("up_proj", "down_proj"), seed=56, std=0.4),
    "all-r16": AdapterSpec(rank=16, alpha=8, target_modules=ALL_MODULES, seed=57, std=0.3),
    "kv-r8-rslora": AdapterSpec(rank=8, alpha=4, use_rslora=True, target_modules=("k_proj", "v_proj"), seed=58,
                                std=0.5),
    # peft's rank_pattern: q at rank 1 beside v at rank 16 inside one projection.
    "q-r1-v-r16": AdapterSpec(rank=16, alpha=8, rank_pattern=(("q_proj", 1),), target_modules=("q_proj", "v_proj"),
                              seed=60, std=0.5),
}
MAX_LORA_RANK = 16
PROMPTS = [[5, 17, 92, 3, 44, 101, 7, 8, 9, 200, 31], [11, 12, 13], list(range(20, 42))]
NUM_NEW = 8
DIFFERS_WITHIN = 4
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def adapters(tiny_llama_folder, tmp_path_factory) -> dict[str, LoRARequest]:
    root = tmp_path_factory.mktemp("lora_shapes")
    return {name: LoRARequest(name, index + 1, str(save_peft_adapter(tiny_llama_folder, root / name, spec)))
            for index, (name, spec) in enumerate(SHAPES.items())}


@pytest.fixture(scope="module")
def references(tiny_llama_folder, adapters) -> dict[str | None, list[list[int]]]:
    """Per shape (None: the base model), peft's merged greedy tokens for each prompt."""
    result = {name: merged_greedy(tiny_llama_folder, Path(adapter.lora_path), PROMPTS, NUM_NEW)
              for name, adapter in adapters.items()}
    result[None] = merged_greedy(tiny_llama_folder, None, PROMPTS, NUM_NEW)
    for name in adapters:
        for prompt_index, (adapted, base) in enumerate(zip(result[name], result[None])):
            assert adapted[:DIFFERS_WITHIN] != base[:DIFFERS_WITHIN], f"{name} changes nothing on prompt {prompt_index}"
    return result


def make_llm(folder, **kwargs) -> LLM:
    return LLM(model=str(folder), dtype="float32", block_size=4, num_blocks=128, enable_lora=True,
               max_lora_rank=MAX_LORA_RANK, **kwargs)


def mixed_cases() -> list[tuple[str | None, int]]:
    """Every shape on every prompt, with base rows between them."""
    names = [name for shape in SHAPES for name in (shape, None)]
    return [(name, index % len(PROMPTS)) for index, name in enumerate(names * len(PROMPTS))]


def tokens(outputs) -> list[list[int]]:
    return [output.token_ids for output in outputs]


@pytest.fixture
def on_the_triton_path(monkeypatch):
    """Engines made in the test run the GPU's delta code: the Triton kernels over weights
    padded to max_lora_rank (off a GPU under Triton's interpreter, tests/conftest.py)."""
    pytest.importorskip("triton", reason="triton is not installed")

    def attach_for_triton(model, step, num_slots, triton_max_rank=0, **kwargs):
        return attach_lora(model, step, num_slots, MAX_LORA_RANK, **kwargs)
    monkeypatch.setattr(loading, "attach_lora", attach_for_triton)


@pytest.mark.parametrize("name", list(SHAPES))
def test_each_shape_alone_matches_peft_merged(tiny_llama_folder, adapters, references, name):
    llm = make_llm(tiny_llama_folder)
    assert tokens(llm.generate(PROMPTS, GREEDY, lora_request=adapters[name])) == references[name]


@pytest.mark.parametrize("name", list(SHAPES))
def test_each_shape_alone_on_the_triton_path_matches_peft_merged(tiny_llama_folder, adapters, references, name,
                                                                 on_the_triton_path):
    llm = make_llm(tiny_llama_folder)
    assert llm.engine.core.executor.runner.adapters.layers[0].max_rank == MAX_LORA_RANK
    assert tokens(llm.generate(PROMPTS, GREEDY, lora_request=adapters[name])) == references[name]


def test_shapes_beside_base_rows_on_the_triton_path_match_peft_merged(tiny_llama_folder, adapters, references,
                                                                      on_the_triton_path):
    """Fewer cases than on the torch path: the interpreter runs each kernel program in Python."""
    llm = make_llm(tiny_llama_folder, max_loras=2)
    cases = [(name, 1) for name in ("qv-r8", None, "k-r1", "q-r1-v-r16")]  # 2 slots: one is refilled
    outputs = llm.generate([PROMPTS[p] for _, p in cases], GREEDY,
                           lora_request=[adapters[name] if name else None for name, _ in cases])
    assert tokens(outputs) == [references[name][p] for name, p in cases]


def test_every_shape_beside_base_rows_and_the_others_matches_peft_merged(tiny_llama_folder, adapters, references):
    """Three slots for eight adapters: each step mixes shapes, slots are refilled with others."""
    llm = make_llm(tiny_llama_folder, max_loras=3)
    cases = mixed_cases()
    outputs = llm.generate([PROMPTS[p] for _, p in cases], GREEDY,
                           lora_request=[adapters[name] if name else None for name, _ in cases])
    assert tokens(outputs) == [references[name][p] for name, p in cases]


def test_every_shape_through_the_engine_core_process_matches_peft_merged(tiny_llama_folder, adapters, references):
    config = EngineArgs.from_kwargs(model=str(tiny_llama_folder), dtype="float32", block_size=4, num_blocks=128,
                                    enable_lora=True, max_loras=4, max_lora_rank=MAX_LORA_RANK).create_engine_config()
    cases = mixed_cases()

    async def generate(client, index, name, prompt_index):
        request = GenerateRequest(f"r{index}", tuple(PROMPTS[prompt_index]), GREEDY,
                                  lora_request=adapters[name] if name else None)
        return [output async for output in client.generate(request)][-1].token_ids

    async def main():
        client = CoreProcessClient(config)
        await client.start()
        try:
            return await asyncio.gather(*(generate(client, index, *case) for index, case in enumerate(cases)))
        finally:
            await client.stop()
    assert list(asyncio.run(main())) == [references[name][p] for name, p in cases]


@pytest.mark.parametrize("name", list(SHAPES))
def test_each_shape_prefilled_on_one_side_and_decoded_on_the_other_matches_peft_merged(
        tiny_llama_folder, adapters, references, name):
    """The prefill computes the prompt's KV with the adapter and sends it; the decode side
    continues from it with the same adapter (one engine in both roles, in-memory connector)."""
    llm = connected_llm(tiny_llama_folder, enable_lora=True, max_lora_rank=MAX_LORA_RANK, block_size=4)
    try:
        for prompt, expected in zip(PROMPTS, references[name]):
            assert run_split(llm, prompt, GREEDY, lora_request=adapters[name]) == expected
    finally:
        llm.engine.shutdown()


def adapter_with_option(folder: Path, tiny_llama_folder, option: str, value) -> Path:
    """A q/v adapter whose adapter_config.json sets `option` (as peft would write it)."""
    save_peft_adapter(tiny_llama_folder, folder, SHAPES["qv-r8"])
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, option: value}))
    return folder


@pytest.mark.parametrize("option, value", [
    ("use_qalora", True), ("alora_invocation_tokens", [5, 6]), ("layer_replication", [[0, 2]]),
    ("alpha_pattern", {"q_proj": 4}), ("target_modules", ["q_proj", "v_proj", "embed_tokens"]),
])
def test_adapters_that_peft_computes_otherwise_are_refused_naming_the_option(tiny_llama_folder, tmp_path, option,
                                                                             value):
    folder = adapter_with_option(tmp_path / option, tiny_llama_folder, option, value)
    llm = make_llm(tiny_llama_folder)
    with pytest.raises(InvalidRequestError, match=option) as error:
        llm.generate([PROMPTS[0]], GREEDY, lora_request=LoRARequest(option, 1, str(folder)))
    assert error.value.field == "lora_request.lora_path"


def test_a_dora_adapter_is_refused_at_load_naming_use_dora(tiny_llama_folder, tmp_path):
    """Made by peft itself; refused by the engine and by an instance's adapter table alike."""
    spec = AdapterSpec(rank=8, alpha=16, target_modules=("q_proj", "v_proj"), seed=59, use_dora=True)
    folder = str(save_peft_adapter(tiny_llama_folder, tmp_path / "dora", spec))
    with pytest.raises(InvalidRequestError, match="use_dora=True"):
        make_llm(tiny_llama_folder).generate([PROMPTS[0]], GREEDY, lora_request=LoRARequest("dora", 1, folder))
    with pytest.raises(InvalidRequestError, match="use_dora=True"):
        AdapterTable(LoRAConfig(enable_lora=True)).load("dora", folder)
