"""LoRA adapters in the engine, on the tiny random-weight Llama (fp32), against peft.

Adapters are made with peft (random, non-zero A and B; several ranks, alphas and target
modules) and saved in peft's format; the reference is peft's merged model run greedily by
transformers. pdserve never merges: it adds each adapter's delta to its own rows, so a batch
mixes adapters and the base model. Every test checks that all KV blocks are free at its end.
"""

import asyncio
import re
from pathlib import Path

import pytest

from shared.core.kv_cache_manager import KVCacheManager
from shared.core.request import Request
from shared.core.scheduler import Scheduler
from shared.core.scheduler_config import SchedulerConfig
from shared.engine import LLM, LoRARequest, SamplingParams
from shared.engine.core_process.client import CoreProcessClient
from shared.engine_api.client import GenerateRequest
from shared.engine_args import EngineArgs
from shared.errors import ConfigurationError, InvalidRequestError
from shared.guided import GuidedDecodingParams as Guided
from shared.kv_cache.block_hash import HashRecipe, prompt_block_hashes
from shared.kv_cache.block_pool import BlockPool
from tests.helpers.greedy_compare import assert_greedy_agrees
from tests.helpers.lora_adapters import AdapterSpec, merged_greedy, save_peft_adapter
from tests.unit.guided_vocab import EOS_TOKEN_ID, decode, tiny_grammar_cache

PROMPTS = [
    [5, 17, 92, 3, 44, 101, 7, 8, 9, 200, 31, 64, 12, 77, 150, 2, 99],
    [11, 12, 13],
    list(range(20, 50)),
]
NUM_NEW = 8
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_NEW, ignore_eos=True)
ADAPTERS = {
    "attn-r4": AdapterSpec(rank=4, alpha=8, target_modules=("q_proj", "v_proj"), seed=1, std=0.3),
    "all-r8-rslora": AdapterSpec(rank=8, alpha=4, use_rslora=True, seed=2, std=0.15,
                                 target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj")),
    "mlp-r16-layer1": AdapterSpec(rank=16, alpha=16, target_modules=("gate_proj", "up_proj", "down_proj", "o_proj"),
                                  seed=3, std=0.1, layers=(1,)),
}


@pytest.fixture(scope="module")
def adapters(tiny_llama_folder, tmp_path_factory) -> dict[str, LoRARequest]:
    root = tmp_path_factory.mktemp("lora_adapters")
    return {name: LoRARequest(name, index + 1, str(save_peft_adapter(tiny_llama_folder, root / name, spec)))
            for index, (name, spec) in enumerate(ADAPTERS.items())}


@pytest.fixture(scope="module")
def references(tiny_llama_folder, adapters) -> dict[str | None, list[list[int]]]:
    """Per adapter name (None: the base model), peft's merged greedy tokens for each prompt."""
    result = {name: merged_greedy(tiny_llama_folder, Path(adapter.lora_path), PROMPTS, NUM_NEW)
              for name, adapter in adapters.items()}
    result[None] = merged_greedy(tiny_llama_folder, None, PROMPTS, NUM_NEW)
    assert all(result[name] != result[None] for name in adapters), "an adapter that changes nothing tests nothing"
    return result


def make_llm(folder, **kwargs) -> LLM:
    kwargs.setdefault("num_blocks", 64)
    kwargs.setdefault("enable_lora", True)
    kwargs.setdefault("max_lora_rank", 16)
    return LLM(model=str(folder), dtype="float32", block_size=4, **kwargs)


def assert_pool_is_whole(llm: LLM):
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks
    assert all(block.ref_count == 0 for block in pool.blocks)


def tokens(outputs) -> list[list[int]]:
    return [output.token_ids for output in outputs]


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_each_adapter_alone_matches_peft_merged(tiny_llama_folder, adapters, references, name):
    llm = make_llm(tiny_llama_folder)
    assert tokens(llm.generate(PROMPTS, GREEDY, lora_request=adapters[name])) == references[name]
    assert_pool_is_whole(llm)


def test_mixed_batch_of_adapters_and_base_matches_each_reference(tiny_llama_folder, adapters, references):
    """Three adapters and the base in one call, with two adapter slots and two adapters kept in
    memory: requests wait for a slot, slots are reused and adapters read again from disk."""
    llm = make_llm(tiny_llama_folder, max_loras=2, max_cpu_loras=2)
    names = [None, *ADAPTERS, "attn-r4", None]
    cases = [(name, index % len(PROMPTS)) for index, name in enumerate(names * 2)]
    outputs = llm.generate([PROMPTS[p] for _, p in cases], GREEDY,
                           lora_request=[adapters[name] if name else None for name, _ in cases])
    assert tokens(outputs) == [references[name][p] for name, p in cases]
    assert_pool_is_whole(llm)


def test_chunked_prefill_with_adapters_gives_the_same_tokens(tiny_llama_folder, adapters, references):
    llm = make_llm(tiny_llama_folder, max_num_batched_tokens=8, max_loras=3)
    names = [None, *ADAPTERS]
    outputs = llm.generate([PROMPTS[2]] * len(names), GREEDY,
                           lora_request=[adapters[name] if name else None for name in names])
    assert tokens(outputs) == [references[name][2] for name in names]
    assert_pool_is_whole(llm)


def test_prefix_cache_is_never_shared_across_adapters(tiny_llama_folder, adapters, references):
    llm = make_llm(tiny_llama_folder)
    prompt, first, second = PROMPTS[2], adapters["attn-r4"], adapters["all-r8-rslora"]
    [base] = llm.generate([prompt], GREEDY)
    [with_first] = llm.generate([prompt], GREEDY, lora_request=first)
    [with_second] = llm.generate([prompt], GREEDY, lora_request=second)
    [first_again] = llm.generate([prompt], GREEDY, lora_request=first)
    [base_again] = llm.generate([prompt], GREEDY)
    assert (base.num_cached_tokens, with_first.num_cached_tokens, with_second.num_cached_tokens) == (0, 0, 0)
    assert first_again.num_cached_tokens > 0 and base_again.num_cached_tokens > 0
    assert [o.token_ids for o in (base, with_first, with_second, first_again, base_again)] == [
        references[None][2], references["attn-r4"][2], references["all-r8-rslora"][2], references["attn-r4"][2],
        references[None][2]]
    assert_pool_is_whole(llm)


def test_the_engine_reports_the_adapters_its_model_runner_holds_in_memory(tiny_llama_folder, adapters):
    """What a heartbeat registers for the gateway's preference (max_cpu_loras=2: least recently
    used dropped)."""
    from shared.engine.introspection import engine_load
    llm = make_llm(tiny_llama_folder, max_loras=2, max_cpu_loras=2)
    assert engine_load(llm.engine.core).resident_lora_adapters == ()
    llm.generate([PROMPTS[1]], GREEDY, lora_request=adapters["attn-r4"])
    assert engine_load(llm.engine.core).resident_lora_adapters == ("attn-r4",)
    for name in ("all-r8-rslora", "mlp-r16-layer1"):
        llm.generate([PROMPTS[1]], GREEDY, lora_request=adapters[name])
    assert engine_load(llm.engine.core).resident_lora_adapters == ("all-r8-rslora", "mlp-r16-layer1")


def test_the_engine_reports_the_adapters_of_its_running_and_waiting_requests(tiny_llama_folder, adapters):
    """GAIE's vllm:lora_requests_info labels (max_num_seqs=1: one runs, the others wait)."""
    from shared.engine.introspection import engine_load
    llm = make_llm(tiny_llama_folder, max_num_seqs=1)
    for name in ("mlp-r16-layer1", "attn-r4"):
        llm.engine.add_request(PROMPTS[1], GREEDY, lora_request=adapters[name])
    llm.engine.add_request(PROMPTS[1], GREEDY)  # the base model names no adapter
    load = engine_load(llm.engine.core)
    assert (load.running_lora_adapters, load.waiting_lora_adapters) == ((), ("attn-r4", "mlp-r16-layer1"))
    llm.engine.step()
    load = engine_load(llm.engine.core)
    assert (load.running_lora_adapters, load.waiting_lora_adapters) == (("mlp-r16-layer1",), ("attn-r4",))


def test_block_hashes_depend_on_the_adapter():
    recipe = HashRecipe("model", 4)
    token_ids = list(range(12))
    base = prompt_block_hashes(token_ids, recipe)
    first = prompt_block_hashes(token_ids, recipe, adapter_key="lora:a:0123")
    second = prompt_block_hashes(token_ids, recipe, adapter_key="lora:b:0123")
    assert len({*base, *first, *second}) == 9
    assert prompt_block_hashes(token_ids, recipe, adapter_key="lora:a:0123") == first


def test_adapter_requests_need_enable_lora(tiny_llama_folder, adapters):
    llm = make_llm(tiny_llama_folder, enable_lora=False)
    with pytest.raises(InvalidRequestError, match="enable_lora") as error:
        llm.generate([PROMPTS[0]], GREEDY, lora_request=adapters["attn-r4"])
    assert error.value.field == "lora_request"
    assert not llm.engine.has_unfinished_requests()
    assert_pool_is_whole(llm)


def test_bad_adapters_are_refused_by_name(tiny_llama_folder, adapters, tmp_path):
    llm = make_llm(tiny_llama_folder, max_lora_rank=8)
    cases = [
        (LoRARequest("wide", 7, adapters["mlp-r16-layer1"].lora_path), "lora_request", "rank 16"),
        (LoRARequest("missing", 8, str(tmp_path / "nowhere")), "lora_request.lora_path", "not a folder"),
        (LoRARequest("empty", 9, str(tmp_path)), "lora_request.lora_path", "adapter_config.json"),
    ]
    for request, field, words in cases:
        with pytest.raises(InvalidRequestError, match=words) as error:
            llm.generate([PROMPTS[0]], GREEDY, lora_request=request)
        assert error.value.field == field
    llm.generate([PROMPTS[0]], GREEDY, lora_request=adapters["attn-r4"])
    with pytest.raises(InvalidRequestError, match="already names") as error:
        llm.generate([PROMPTS[0]], GREEDY, lora_request=LoRARequest("other", 1, adapters["all-r8-rslora"].lora_path))
    assert error.value.field == "lora_request.lora_int_id"
    assert not llm.engine.has_unfinished_requests()
    assert_pool_is_whole(llm)


def test_adapters_of_modules_the_engine_cannot_adapt_are_refused(tiny_llama_folder, tmp_path):
    spec = AdapterSpec(rank=4, alpha=8, target_modules=("q_proj", "lm_head"), seed=4)
    folder = save_peft_adapter(tiny_llama_folder, tmp_path / "head", spec)
    llm = make_llm(tiny_llama_folder)
    with pytest.raises(InvalidRequestError, match="lm_head") as error:
        llm.generate([PROMPTS[0]], GREEDY, lora_request=LoRARequest("head", 1, str(folder)))
    assert error.value.field == "lora_request.lora_path"
    assert_pool_is_whole(llm)


def test_an_adapter_gone_before_its_step_fails_only_its_requests(tiny_llama_folder, adapters, references, tmp_path):
    folder = tmp_path / "vanishing"
    save_peft_adapter(tiny_llama_folder, folder, ADAPTERS["attn-r4"])
    llm = make_llm(tiny_llama_folder)
    engine = llm.engine
    doomed = engine.add_request(PROMPTS[0], GREEDY, lora_request=LoRARequest("vanishing", 5, str(folder)))
    kept = engine.add_request(PROMPTS[1], GREEDY, lora_request=adapters["attn-r4"])
    (folder / "adapter_model.safetensors").unlink()
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({output.request_id: output for output in engine.step() if output.finished})
    assert finished[doomed].outputs[0].finish_reason == "error"
    assert "vanishing" in finished[doomed].outputs[0].error
    assert finished[kept].outputs[0].token_ids == references["attn-r4"][1]
    assert_pool_is_whole(llm)


@pytest.mark.parametrize("method,extra", [("ngram", {}), ("draft", {"draft_num_layers": 1})])
def test_speculative_decoding_with_adapters_is_refused_by_name(tiny_llama_folder, method, extra):
    with pytest.raises(ConfigurationError, match=f"'{method}' cannot be combined with enable_lora: speculative "
                                                 "decoding with LoRA adapters is not supported") as error:
        make_llm(tiny_llama_folder, speculative_method=method, num_speculative_tokens=2, **extra)
    assert error.value.field == "speculative_method"


def test_bf16_packed_model_applies_adapters(tiny_llama_folder, adapters, references):
    """bf16 (oneDNN-packed layers, the MLP unfused for LoRA): the adapter's output differs from
    the base model's, and base rows beside adapter rows are the base model's."""
    llm = LLM(model=str(tiny_llama_folder), dtype="bfloat16", block_size=4, num_blocks=64, enable_lora=True,
              max_lora_rank=16)
    plain = LLM(model=str(tiny_llama_folder), dtype="bfloat16", block_size=4, num_blocks=64)
    outputs = llm.generate([PROMPTS[0], PROMPTS[0]], GREEDY, lora_request=[adapters["attn-r4"], None])
    [base] = plain.generate([PROMPTS[0]], GREEDY)
    assert outputs[0].token_ids != outputs[1].token_ids
    assert_greedy_agrees(plain, PROMPTS[0], outputs[1].token_ids, base.token_ids)
    assert_pool_is_whole(llm)


def test_the_engine_core_process_serves_adapters_beside_the_base(tiny_llama_folder, adapters, references):
    """Through the typed engine API that services use (the core in a child process)."""
    config = EngineArgs.from_kwargs(model=str(tiny_llama_folder), dtype="float32", block_size=4, num_blocks=64,
                                    enable_lora=True, max_lora_rank=16).create_engine_config()
    cases = [(None, 0), ("attn-r4", 0), ("all-r8-rslora", 1), ("attn-r4", 2)]

    async def generate(client, index, name, prompt_index):
        request = GenerateRequest(f"r{index}", tuple(PROMPTS[prompt_index]), GREEDY,
                                  lora_request=adapters[name] if name else None)
        return [output async for output in client.generate(request)][-1].token_ids

    async def main():
        client = CoreProcessClient(config)
        await client.start()
        try:
            results = await asyncio.gather(*(generate(client, index, *case) for index, case in enumerate(cases)))
            assert list(results) == [references[name][p] for name, p in cases]
            bad = GenerateRequest("bad", (1, 2, 3), GREEDY, lora_request=LoRARequest("gone", 9, "/nowhere"))
            with pytest.raises(InvalidRequestError, match="not a folder"):
                [output async for output in client.generate(bad)]
            status = await client.status()
            assert status.load.num_free_blocks == status.load.num_total_blocks
            assert status.load.resident_lora_adapters == ("all-r8-rslora", "attn-r4")  # what heartbeats send
        finally:
            await client.stop()
    asyncio.run(main())


def test_guided_requests_with_adapters_follow_their_constraints(tiny_llama_folder, adapters):
    """The grammar's mask applies to an adapter's logits as to the base model's."""
    llm = make_llm(tiny_llama_folder)
    llm.engine.core.guided.use_grammar_cache(tiny_grammar_cache())
    constraints = [Guided(regex=r"20[0-9]{2}-[01][0-9]"), Guided(choice=["yes", "no", "maybe"]),
                   Guided(grammar='root ::= "(" ("ab")+ ")"')]
    names = [*ADAPTERS, None]
    cases = [(guided, name) for guided in constraints for name in names]
    params = [SamplingParams(temperature=0, max_tokens=30, guided=guided) for guided, _ in cases]
    outputs = llm.generate([PROMPTS[0]] * len(cases), params,
                           lora_request=[adapters[name] if name else None for _, name in cases])
    for (guided, _), output in zip(cases, outputs):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop" and completion.token_ids[-1] == EOS_TOKEN_ID
        text = decode(completion.token_ids)
        if guided.choice is not None:
            assert text in guided.choice
        else:
            assert re.fullmatch(guided.regex or r"\((ab)+\)", text), text
    assert_pool_is_whole(llm)


def test_the_scheduler_admits_requests_only_while_their_adapters_fit_max_loras():
    """Running requests never use more than max_loras adapters; the next in line waits for one
    to finish, and the requests behind it wait too (first come, first served)."""
    kv = KVCacheManager(BlockPool(64), 4, True)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64), kv, max_model_len=1024,
                          max_loras=2)
    lora = {index: LoRARequest(f"a{index}", index, f"/adapters/a{index}") for index in (1, 2, 3)}

    def request(request_id: str, adapter: int | None, max_tokens: int) -> Request:
        made = Request(request_id, [5, 6, 7], SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                       max_output_tokens=max_tokens)
        made.lora_request = lora.get(adapter)
        return made

    for made in (request("one", 1, 1), request("two", 2, 3), request("three", 3, 2), request("base", None, 2)):
        scheduler.add_request(made)
    steps = []
    while scheduler.num_unfinished:
        output = scheduler.schedule()
        steps.append({item.request_id for item in output.scheduled})
        adapters = {item.lora_request.lora_int_id for item in output.scheduled if item.lora_request}
        assert len(adapters) <= 2
        scheduler.update_from_output(output, {item.request_id: 9 for item in output.scheduled})
    assert steps[0] == {"one", "two"}  # "three" waits, first in line, and "base" behind it
    assert steps[1] == {"two", "three", "base"}  # "one" finished: its slot went to "three"
    assert kv.pool.num_free_blocks == kv.pool.num_blocks
