"""LoRA adapters with tensor (and pipeline) parallelism, on a tiny random Llama in fp32, against peft.

Adapter weights are cut as their base layers are (shared.parallel.lora_sharding): q/k/v and
gate/up keep their rank's rows of B, o_proj and down_proj their rank's columns of A with the
partial delta summed by the layer's all-reduce. Greedy output of a mixed batch (adapters and
the base model) through worker processes equals peft's merged model token for token.
"""

import pytest
import torch
from transformers import LlamaConfig
from transformers import LlamaForCausalLM as HFLlamaForCausalLM

from shared.engine import LLM, LoRARequest, SamplingParams
from shared.engine.introspection import engine_load
from shared.parallel.lora_sharding import shard_adapter
from tests.helpers.lora_adapters import AdapterSpec, merged_greedy, save_peft_adapter
from tests.unit.conftest import TINY_LLAMA

PROMPTS = [[5, 9, 13, 2, 40, 41, 42, 7, 8, 9, 10, 11, 12, 13], [17, 3, 99, 4, 5, 6], list(range(30, 52))]
NUM_NEW = 6
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True)
ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SPECS = {
    "all-r8-rslora": AdapterSpec(rank=8, alpha=4, use_rslora=True, seed=21, std=0.15, target_modules=ALL_MODULES),
    "qv-r4": AdapterSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj"), seed=22, std=0.3),
    "mlp-o-r16-layer2": AdapterSpec(rank=16, alpha=16, target_modules=("o_proj", "gate_proj", "up_proj",
                                                                        "down_proj"), seed=23, std=0.1, layers=(2,)),
}
# Per prompt of the batch: its adapter (None: the base model).
CASES = [("all-r8-rslora", 0), (None, 1), ("qv-r4", 2), ("mlp-o-r16-layer2", 0), ("all-r8-rslora", 2), (None, 0)]


@pytest.fixture(scope="module")
def parallel_llama_folder(tmp_path_factory):
    """8 heads / 4 KV heads / 4 layers: TP=2 and PP=2 both split it."""
    config = LlamaConfig(**{**TINY_LLAMA, "num_attention_heads": 8, "num_key_value_heads": 4,
                            "num_hidden_layers": 4}, tie_word_embeddings=True)
    torch.manual_seed(3)
    folder = tmp_path_factory.mktemp("parallel_lora_llama")
    HFLlamaForCausalLM(config).eval().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def adapters(parallel_llama_folder, tmp_path_factory) -> dict[str, LoRARequest]:
    root = tmp_path_factory.mktemp("parallel_lora_adapters")
    return {name: LoRARequest(name, index + 1, str(save_peft_adapter(parallel_llama_folder, root / name, spec)))
            for index, (name, spec) in enumerate(SPECS.items())}


@pytest.fixture(scope="module")
def references(parallel_llama_folder, adapters) -> dict[str | None, list[list[int]]]:
    result = {name: merged_greedy(parallel_llama_folder, adapter.lora_path, PROMPTS, NUM_NEW)
              for name, adapter in adapters.items()}
    result[None] = merged_greedy(parallel_llama_folder, None, PROMPTS, NUM_NEW)
    assert all(result[name] != result[None] for name in adapters), "an adapter that changes nothing tests nothing"
    return result


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)])
def test_parallel_mixed_adapter_batch_matches_peft_merged(parallel_llama_folder, adapters, references, tp, pp):
    with LLM(model=str(parallel_llama_folder), dtype="float32", num_blocks=64, max_num_batched_tokens=16,
             block_size=4, enable_lora=True, max_loras=2, max_cpu_loras=2, max_lora_rank=16,
             tensor_parallel_size=tp, pipeline_parallel_size=pp) as llm:
        outputs = llm.generate([PROMPTS[p] for _, p in CASES], GREEDY,
                               lora_request=[adapters[name] if name else None for name, _ in CASES])
        assert [output.token_ids for output in outputs] == [references[name][p] for name, p in CASES]
        pool = llm.engine.core.block_pool
        assert pool.num_free_blocks == pool.num_blocks
        # The output rank reports the adapters in memory (max_cpu_loras=2: the last two used).
        assert len(engine_load(llm.engine.core).resident_lora_adapters) == 2


def test_the_ranks_shards_of_an_adapter_add_up_to_its_delta():
    """Column-parallel: each rank's rows of the output; row-parallel: the ranks' partial deltas
    sum to the whole one. Layers outside the stage are dropped, the others renumbered."""
    generator = torch.Generator().manual_seed(0)
    x_in, rank, x_out = 12, 4, 8
    q = (torch.randn(rank, x_in, generator=generator), torch.randn(x_out, rank, generator=generator))
    down = (torch.randn(rank, x_in, generator=generator), torch.randn(x_out, rank, generator=generator))
    modules = {(1, "q_proj"): q, (2, "down_proj"): down, (0, "q_proj"): q}
    x = torch.randn(3, x_in, generator=generator)
    shards = [shard_adapter(modules, tensor_rank, 2, range(1, 3)) for tensor_rank in range(2)]
    assert all(set(shard) == {(0, "q_proj"), (1, "down_proj")} for shard in shards)
    column_parts = [(x @ s[(0, "q_proj")][0].T) @ s[(0, "q_proj")][1].T for s in shards]
    torch.testing.assert_close(torch.cat(column_parts, dim=1), (x @ q[0].T) @ q[1].T)
    row_parts = [(x.chunk(2, dim=1)[r] @ s[(1, "down_proj")][0].T) @ s[(1, "down_proj")][1].T
                 for r, s in enumerate(shards)]
    torch.testing.assert_close(row_parts[0] + row_parts[1], (x @ down[0].T) @ down[1].T)
