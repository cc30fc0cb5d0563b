"""Deterministic (batch-invariant) mode on the tiny random Llama in bfloat16.

Exact equality is the point here: with `deterministic=True` a token's logits are the same
bits whether its sequence ran alone or among others, its prompt in one piece or in chunks,
its prefix computed now or found in the prefix cache, with or without speculation. The
control test shows the same comparisons fail in the default mode, so these tests can fail.
"""

import pytest
import torch

from shared.attention.native_decode import PATH_ENV_VAR, load_native_decode
from shared.attention.torch_paged import DETERMINISTIC_PATHS, TorchPagedAttention
from shared.errors import ConfigurationError
from shared.engine import LLM, SamplingParams
from shared.kv_cache.layout import KVCacheLayout
from shared.model.batch_invariance import RowTiled, is_row_invariant, make_batch_invariant
from shared.model.loader import load_model
from shared.model.config import ModelConfig
from shared.native import cpu_matmul
from tests.unit.paged_batch import StepSequence, build_batch

BLOCK_SIZE = 4
NUM_BLOCKS = 64
PROMPT_A = [5, 17, 92, 3, 44, 101, 7, 8, 9, 200, 31, 64, 12, 77, 150, 2, 99, 250, 1, 42, 6, 18, 93, 4]
PROMPT_B = [11, 12, 13, 14, 15, 16, 17]
PROMPT_C = [250, 1, 250, 1, 250, 33, 34, 35, 36, 37, 38]
ENGINE_PROMPTS = [PROMPT_A, PROMPT_B, PROMPT_C, list(range(20, 60)), [3] * 12]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)


def tiny_model(folder, deterministic: bool):
    config = ModelConfig.from_folder(folder)
    backend = TorchPagedAttention(config.num_heads, config.num_kv_heads, config.head_dim,
                                  deterministic=deterministic)
    model, _ = load_model(folder, torch.bfloat16, attn_backend=backend, deterministic=deterministic)
    if deterministic:
        make_batch_invariant(model)
    return model


class PagedRunner:
    """Steps over one KV cache; sequences get blocks from a shuffled free list, or share the
    leading blocks of another sequence (a prefix-cache hit)."""

    def __init__(self, model):
        config = model.config
        self.model = model
        self.kv_cache = KVCacheLayout(config.num_layers, NUM_BLOCKS, BLOCK_SIZE, config.num_kv_heads,
                                      config.head_dim, torch.bfloat16).allocate()
        self.free_blocks = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(5)).tolist()
        self.block_ids: dict[str, list[int]] = {}

    def share_prefix(self, name: str, source: str, num_blocks: int) -> None:
        self.block_ids[name] = list(self.block_ids[source][:num_blocks])

    def sequence(self, name: str, context_len: int, query_len: int) -> StepSequence:
        blocks = self.block_ids.setdefault(name, [])
        while len(blocks) * BLOCK_SIZE < context_len:
            blocks.append(self.free_blocks.pop())
        return StepSequence(list(blocks), context_len, query_len)

    def step(self, decodes, prefills, token_ids: list[int]) -> torch.Tensor:
        """decodes/prefills: (name, context_len, query_len) -> float32 logits of every row."""
        batch = build_batch([self.sequence(*d) for d in decodes], [self.sequence(*p) for p in prefills], BLOCK_SIZE)
        with torch.inference_mode():
            return self.model(torch.tensor(token_ids), batch.positions, self.kv_cache, batch.metadata,
                              torch.arange(len(token_ids)))


def whole_prompt(model) -> torch.Tensor:
    return PagedRunner(model).step([], [("a", len(PROMPT_A), len(PROMPT_A))], PROMPT_A)


def in_chunks(model, sizes=(5, 1, 7, 4, 7)) -> torch.Tensor:
    runner, rows, done = PagedRunner(model), [], 0
    for size in sizes:
        done += size
        rows.append(runner.step([], [("a", done, size)], PROMPT_A[done - size:done]))
    return torch.cat(rows)


def token_by_token(model) -> torch.Tensor:
    runner = PagedRunner(model)
    rows = [runner.step([], [("a", 1, 1)], PROMPT_A[:1])]
    for position in range(1, len(PROMPT_A)):
        rows.append(runner.step([("a", position + 1, 1)], [], PROMPT_A[position:position + 1]))
    return torch.cat(rows)


def among_others(model) -> torch.Tensor:
    """A's prompt split over steps shared with other prompts and decodes, in varying positions."""
    runner = PagedRunner(model)
    b, c = PROMPT_B, PROMPT_C
    first = runner.step([], [("b", 6, 6), ("a", 10, 10)], b[:6] + PROMPT_A[:10])
    second = runner.step([("b", 7, 1)], [("c", 11, 11), ("a", 23, 13)], [b[6]] + c + PROMPT_A[10:23])
    third = runner.step([("c", 12, 1), ("a", 24, 1), ("b", 8, 1)], [], [9, PROMPT_A[23], 3])
    return torch.cat([first[6:], second[12:], third[1:2]])


def after_cached_prefix(model) -> torch.Tensor:
    """A's first 12 tokens computed by another sequence; A reuses those 3 blocks."""
    runner = PagedRunner(model)
    prefix_rows = runner.step([], [("earlier", 12, 12)], PROMPT_A[:12])
    runner.share_prefix("a", "earlier", 12 // BLOCK_SIZE)
    rest = runner.step([("b", 1, 1)], [("a", len(PROMPT_A), 12)], [PROMPT_B[0]] + PROMPT_A[12:])
    return torch.cat([prefix_rows, rest[1:]])


SCHEDULES = [in_chunks, token_by_token, among_others, after_cached_prefix]


@pytest.fixture(scope="module")
def deterministic_model(tiny_llama_folder):
    return tiny_model(tiny_llama_folder, deterministic=True)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda schedule: schedule.__name__)
def test_logits_are_the_same_bits_however_the_prompt_is_scheduled(deterministic_model, schedule):
    assert torch.equal(schedule(deterministic_model), whole_prompt(deterministic_model))


def test_default_mode_differs_so_the_comparison_can_fail(tiny_llama_folder, monkeypatch):
    # bf16 matmuls as on a CPU with bf16 hardware: on one without, the default mode computes in
    # fp32 (shared.native.cpu_matmul) and this tiny model's rows then round to the same bf16.
    monkeypatch.setenv(cpu_matmul.ENV_VAR, "bfloat16")
    model = tiny_model(tiny_llama_folder, deterministic=False)
    expected = whole_prompt(model)
    assert any(not torch.equal(schedule(model), expected) for schedule in SCHEDULES)


def test_row_tiles_keep_rows_apart_and_the_probe_catches_batch_dependence():
    linear = torch.nn.Linear(16, 8).to(torch.bfloat16)
    rows = torch.randn(70, 16).to(torch.bfloat16)
    tiled = RowTiled(linear, tile=8)
    assert torch.equal(tiled(rows), torch.cat([tiled(row[None]) for row in rows]))

    def batch_dependent(x: torch.Tensor) -> torch.Tensor:
        return x[:, :4] + x.mean()
    assert not is_row_invariant(batch_dependent, 16, torch.float32, torch.device("cpu"))
    assert is_row_invariant(lambda x: x[:, :4] * 2, 16, torch.float32, torch.device("cpu"))


def make_llm(folder, **kwargs) -> LLM:
    return LLM(model=str(folder), dtype="bfloat16", block_size=BLOCK_SIZE, num_blocks=128, deterministic=True,
               **kwargs)


def tokens_and_logprobs(outputs) -> list[tuple[list[int], list[float]]]:
    return [(output.outputs[0].token_ids, [entry.logprob for entry in output.outputs[0].logprobs])
            for output in outputs]


@pytest.fixture(scope="module")
def each_alone(tiny_llama_folder):
    """Every prompt generated on its own in a fresh engine."""
    return [tokens_and_logprobs(make_llm(tiny_llama_folder).generate([prompt], GREEDY))[0]
            for prompt in ENGINE_PROMPTS]


@pytest.mark.parametrize("engine_kwargs", [
    {}, {"max_num_batched_tokens": 6}, {"speculative_method": "ngram", "num_speculative_tokens": 3},
    {"speculative_method": "draft", "draft_num_layers": 1, "max_num_batched_tokens": 9},
], ids=["batched", "chunked", "ngram", "draft-chunked"])
def test_engine_output_in_a_batch_equals_each_prompt_alone(tiny_llama_folder, each_alone, engine_kwargs):
    llm = make_llm(tiny_llama_folder, **engine_kwargs)
    assert tokens_and_logprobs(llm.generate(ENGINE_PROMPTS, GREEDY)) == each_alone
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks


def test_prefix_cache_hits_give_the_same_output(tiny_llama_folder, each_alone):
    llm = make_llm(tiny_llama_folder)
    llm.generate(ENGINE_PROMPTS[::-1], GREEDY)
    outputs = llm.generate(ENGINE_PROMPTS, GREEDY)
    assert all(output.num_cached_tokens > 0 for output in outputs if len(output.prompt_token_ids) > BLOCK_SIZE)
    assert tokens_and_logprobs(outputs) == each_alone


@pytest.mark.parametrize("path", DETERMINISTIC_PATHS)
def test_every_path_deterministic_mode_may_take_holds_on_this_machine(tiny_llama_folder, monkeypatch, path):
    """Forced onto each kernel path it allows (the ones this CPU has): a prompt in a batch equals
    it alone, and prefix-cached equals fresh, exactly (tokens and logprobs)."""
    config = ModelConfig.from_folder(tiny_llama_folder)
    shapes = (config.num_heads, config.num_kv_heads, config.head_dim, BLOCK_SIZE, torch.bfloat16)
    if path not in load_native_decode().available_paths(*shapes):
        pytest.skip(f"this CPU has no {path} path")
    monkeypatch.setenv(PATH_ENV_VAR, path)
    alone = [tokens_and_logprobs(make_llm(tiny_llama_folder).generate([prompt], GREEDY))[0]
             for prompt in ENGINE_PROMPTS]
    llm = make_llm(tiny_llama_folder)
    assert llm.engine.core.executor.compute_paths.decode_attention == f"C++ kernel, {path} path"
    assert tokens_and_logprobs(llm.generate(ENGINE_PROMPTS, GREEDY)) == alone
    cached = llm.generate(ENGINE_PROMPTS[::-1], GREEDY)
    assert all(output.num_cached_tokens > 0 for output in cached if len(output.prompt_token_ids) > BLOCK_SIZE)
    assert tokens_and_logprobs(cached) == alone[::-1]


def test_deterministic_mode_refuses_the_bf16_hardware_paths(tiny_llama_folder, monkeypatch):
    monkeypatch.setenv(PATH_ENV_VAR, "amx")
    with pytest.raises(ConfigurationError, match="deterministic mode runs on the avx512f or portable path"):
        make_llm(tiny_llama_folder).generate([PROMPT_A], GREEDY)


def test_deterministic_mode_is_refused_where_it_cannot_hold(tiny_llama_folder):
    with pytest.raises(ValueError, match="decode_kernel"):
        TorchPagedAttention(4, 2, 16, decode_kernel="torch", deterministic=True)


def test_layers_failing_the_probe_run_on_fixed_tiles_and_hopeless_ones_are_an_error(monkeypatch):
    from shared.model import batch_invariance
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    monkeypatch.setattr(batch_invariance, "is_row_invariant",
                        lambda module, *args: isinstance(module, RowTiled) or module.out_features == 4)
    assert make_batch_invariant(model) == 1
    assert isinstance(model[0], RowTiled) and isinstance(model[1], torch.nn.Linear)
    monkeypatch.setattr(batch_invariance, "is_row_invariant", lambda module, *args: False)
    with pytest.raises(RuntimeError, match="batch-dependent results even on fixed 64-row tiles"):
        make_batch_invariant(torch.nn.Sequential(torch.nn.Linear(8, 8)))
