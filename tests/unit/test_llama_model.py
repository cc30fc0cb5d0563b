"""Our Llama against transformers' on the tiny random-weight checkpoints, in float32.

Whatever way the tokens reach the model (a whole prompt, chunks through the paged cache, one
token at a time, several sequences in one flat batch) its logits must equal transformers'
logits for the same sequence positions.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from shared.errors import ConfigurationError
from shared.kv_cache.layout import KVCacheLayout
from shared.model.loader import load_model
from shared.model.llama import LlamaMLP
from shared.model.packed_linear import PackedGatedMLP, PackedLinear, can_pack
from tests.unit.paged_batch import StepSequence, build_batch

BLOCK_SIZE = 4
NUM_BLOCKS = 48
ATOL = 1e-5
PROMPT_A = [5, 17, 92, 3, 44, 101, 7, 8, 9, 200, 31, 64, 12, 77, 150, 2, 99, 250, 1, 42]
PROMPT_B = [11, 12, 13, 14, 15, 16, 17]
PROMPT_C = [250, 1, 250, 1, 250]


@pytest.fixture(scope="module", params=["tiny_llama_folder", "tiny_llama_untied_folder"], ids=["tied", "untied"])
def folder(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def ours(folder):
    model, config = load_model(folder, torch.float32)
    return model


@pytest.fixture(scope="module")
def reference_logits(folder):
    """Callable: token ids -> transformers' float32 logits for every position."""
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def logits(token_ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return hf_model(torch.tensor([token_ids])).logits[0]
    return logits


class PagedRunner:
    """Feeds steps to the model over one KV cache, with blocks handed out in shuffled order."""

    def __init__(self, model, dtype=torch.float32):
        config = model.config
        self.model = model
        self.kv_cache = KVCacheLayout(config.num_layers, NUM_BLOCKS, BLOCK_SIZE, config.num_kv_heads,
                                      config.head_dim, dtype).allocate()
        self.free_blocks = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(3)).tolist()
        self.block_ids: dict[str, list[int]] = {}

    def sequence(self, name: str, context_len: int, query_len: int) -> StepSequence:
        blocks = self.block_ids.setdefault(name, [])
        while len(blocks) * BLOCK_SIZE < context_len:
            blocks.append(self.free_blocks.pop())
        return StepSequence(list(blocks), context_len, query_len)

    def step(self, decodes, prefills, token_ids: list[int], logits_rows=None) -> torch.Tensor:
        """decodes/prefills: (name, context_len, query_len) -> logits of `logits_rows` (default all)."""
        batch = build_batch([self.sequence(*d) for d in decodes], [self.sequence(*p) for p in prefills], BLOCK_SIZE)
        rows = torch.arange(len(token_ids)) if logits_rows is None else torch.tensor(logits_rows, dtype=torch.long)
        with torch.inference_mode():
            return self.model(torch.tensor(token_ids), batch.positions, self.kv_cache, batch.metadata, rows)


def test_whole_prompt_matches_transformers(ours, reference_logits):
    logits = PagedRunner(ours).step([], [("a", len(PROMPT_A), len(PROMPT_A))], PROMPT_A)
    assert logits.shape == (len(PROMPT_A), 256) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, reference_logits(PROMPT_A), rtol=0, atol=ATOL)


def test_prompt_in_chunks_through_the_cache_matches_transformers(ours, reference_logits):
    runner = PagedRunner(ours)
    chunks, done = [], 0
    for size in [5, 1, 7, 4, 3]:
        done += size
        chunks.append(runner.step([], [("a", done, size)], PROMPT_A[done - size:done]))
    torch.testing.assert_close(torch.cat(chunks), reference_logits(PROMPT_A), rtol=0, atol=ATOL)


def test_token_by_token_decode_matches_transformers(ours, reference_logits):
    runner = PagedRunner(ours)
    rows = [runner.step([], [("a", 1, 1)], PROMPT_A[:1])]
    for position in range(1, len(PROMPT_A)):
        rows.append(runner.step([("a", position + 1, 1)], [], PROMPT_A[position:position + 1]))
    torch.testing.assert_close(torch.cat(rows), reference_logits(PROMPT_A), rtol=0, atol=ATOL)


def test_sequences_sharing_flat_batches_match_transformers(ours, reference_logits):
    """Step 1: two prompts. Step 2: both decode while a third prompt starts. Step 3: three decodes."""
    runner = PagedRunner(ours)
    a, b, c = PROMPT_A[:12], PROMPT_B, PROMPT_C
    first = runner.step([], [("a", 11, 11), ("b", 6, 6)], a[:11] + b[:6])
    second = runner.step([("a", 12, 1), ("b", 7, 1)], [("c", 4, 4)], [a[11], b[6]] + c[:4])
    third = runner.step([("a", 13, 1), ("b", 8, 1), ("c", 5, 1)], [], [PROMPT_A[12], 3, c[4]])
    expected_a, expected_b = reference_logits(PROMPT_A[:13]), reference_logits(b + [3])
    expected_c = reference_logits(c)
    torch.testing.assert_close(first, torch.cat([expected_a[:11], expected_b[:6]]), rtol=0, atol=ATOL)
    torch.testing.assert_close(second, torch.cat([expected_a[11:12], expected_b[6:7], expected_c[:4]]),
                               rtol=0, atol=ATOL)
    torch.testing.assert_close(third, torch.stack([expected_a[12], expected_b[7], expected_c[4]]),
                               rtol=0, atol=ATOL)


def test_only_the_requested_rows_get_logits(ours, reference_logits):
    runner = PagedRunner(ours)
    last_rows = runner.step([], [("a", 9, 9), ("b", 7, 7)], PROMPT_A[:9] + PROMPT_B, logits_rows=[15, 8])
    expected = torch.stack([reference_logits(PROMPT_B)[-1], reference_logits(PROMPT_A[:9])[-1]])
    torch.testing.assert_close(last_rows, expected, rtol=0, atol=ATOL)
    none = PagedRunner(ours).step([], [("a", 3, 3)], PROMPT_A[:3], logits_rows=[])
    assert none.shape == (0, 256)


def test_bfloat16_is_as_close_to_float32_as_transformers_bfloat16(folder, reference_logits):
    model, _ = load_model(folder, torch.bfloat16)
    ours_bf16 = PagedRunner(model, torch.bfloat16).step([], [("a", 20, 20)], PROMPT_A)
    hf_bf16 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        theirs_bf16 = hf_bf16(torch.tensor([PROMPT_A])).logits[0].float()
    exact = reference_logits(PROMPT_A)
    our_error = (ours_bf16 - exact).abs().max()
    their_error = (theirs_bf16 - exact).abs().max()
    assert our_error <= 1.5 * their_error


def test_bfloat16_layers_are_packed_where_onednn_supports_it(tiny_llama_folder):
    model, _ = load_model(tiny_llama_folder, torch.bfloat16)
    is_packed = can_pack(torch.bfloat16)
    assert type(model.layers[0].self_attn.qkv_proj) is (PackedLinear if is_packed else torch.nn.Linear)
    assert type(model.lm_head) is (PackedLinear if is_packed else torch.nn.Linear)
    assert type(model.layers[1].mlp) is (PackedGatedMLP if is_packed else LlamaMLP)
    float32_model, _ = load_model(tiny_llama_folder, torch.float32)
    assert type(float32_model.layers[0].mlp) is LlamaMLP
    assert type(float32_model.layers[0].mlp.gate_up_proj) is torch.nn.Linear


def test_fused_weights_have_the_expected_shapes(tiny_llama_folder):
    model, config = load_model(tiny_llama_folder, torch.float32)
    layer = model.layers[1]
    assert layer.self_attn.qkv_proj.weight.shape == ((4 + 2 + 2) * 16, 64)
    assert layer.mlp.gate_up_proj.weight.shape == (2 * 128, 64)
    assert model.lm_head.weight is model.embed_tokens.weight
    assert config.num_layers == 2 and config.head_dim == 16


def test_unsupported_dtype_is_rejected(tiny_llama_folder):
    with pytest.raises(ConfigurationError) as error:
        load_model(tiny_llama_folder, torch.float16)
    assert error.value.field == "dtype"


def test_folder_without_weights_is_rejected(tmp_path, tiny_llama_folder):
    (tmp_path / "config.json").write_text((tiny_llama_folder / "config.json").read_text())
    with pytest.raises(ConfigurationError, match="has no \\*.safetensors weights") as error:
        load_model(tmp_path, torch.float32)
    assert error.value.field == "model"


def test_missing_weight_is_named(tmp_path, tiny_llama_folder):
    from safetensors.torch import load_file, save_file
    (tmp_path / "config.json").write_text((tiny_llama_folder / "config.json").read_text())
    weights = load_file(str(tiny_llama_folder / "model.safetensors"))
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigurationError, match="missing \\['layers.1.mlp.gate_up_proj.weight'\\]"):
        load_model(tmp_path, torch.float32)


@pytest.mark.skipif(not can_pack(torch.bfloat16), reason="oneDNN without native bf16")
@pytest.mark.parametrize("num_rows", [1, 9, 130, 2049])
def test_packed_layers_pad_rows_to_a_bucket_and_return_only_the_real_rows(num_rows):
    torch.manual_seed(num_rows)
    linear = torch.nn.Linear(64, 48).to(torch.bfloat16)
    x = torch.randn(num_rows, 64, dtype=torch.bfloat16)
    out = PackedLinear(linear)(x)
    assert out.shape == (num_rows, 48)
    expected = torch.nn.functional.linear(x.float(), linear.weight.float(), linear.bias.float())
    torch.testing.assert_close(out.float(), expected, atol=0.1, rtol=0.02)
