"""The GGUF -> HF converter's pieces, on a tiny GGUF file written by the test itself.

The full conversion of the real SmolLM2 GGUF (tokenizer included) is in
tests/e2e/test_default_model.py.
"""

from pathlib import Path

import gguf
import numpy as np
import pytest

from shared.errors import ConfigurationError
from shared.model.gguf_convert import (
    LlamaHyperparams,
    build_config,
    convert_gguf_to_hf,
    hf_tensor_name,
    read_hf_weights,
    read_hyperparams,
    unpermute_rope_rows,
)

# HF row order within one head of size 4 is [0, 1, 2, 3]; llama.cpp interleaves the halves.
LLAMA_CPP_ROWS_ONE_HEAD = [0, 2, 1, 3]
LLAMA_CPP_ROWS_TWO_HEADS = [0, 2, 1, 3, 4, 6, 5, 7]

HF_Q = np.arange(64, dtype=np.float32).reshape(8, 8)  # 2 heads x head_dim 4, hidden 8
HF_K = np.arange(32, dtype=np.float32).reshape(4, 8) + 100  # 1 kv head x head_dim 4


def write_tiny_gguf(path: Path, architecture: str = "llama") -> Path:
    """One layer, hidden 8, 2 heads, 1 kv head, head_dim 4, vocab 3; Q/K in llama.cpp order."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(32)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_block_count(1)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_token_list(["a", "b", "c"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template("{{ messages }}")
    writer.add_tensor("blk.0.attn_q.weight", HF_Q[LLAMA_CPP_ROWS_TWO_HEADS])
    writer.add_tensor("blk.0.attn_k.weight", HF_K[LLAMA_CPP_ROWS_ONE_HEAD])
    writer.add_tensor("blk.0.ffn_down.weight", np.ones((8, 16), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TINY_PARAMS = LlamaHyperparams(
    context_length=32,
    hidden_size=8,
    intermediate_size=16,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    rope_theta=100000.0,
    rms_norm_eps=1e-05,
    vocab_size=3,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
    chat_template="{{ messages }}",
)


def test_unpermute_rope_rows_restores_hf_half_layout_per_head():
    rows = np.array(LLAMA_CPP_ROWS_TWO_HEADS, dtype=np.float32)
    assert unpermute_rope_rows(rows, num_heads=2).tolist() == [0, 1, 2, 3, 4, 5, 6, 7]


def test_unpermute_rope_rows_keeps_columns_together():
    assert np.array_equal(unpermute_rope_rows(HF_K[LLAMA_CPP_ROWS_ONE_HEAD], num_heads=1), HF_K)


def test_unpermute_rope_rows_rejects_odd_head_dim():
    with pytest.raises(ConfigurationError, match="6 rows do not split into 2 heads") as info:
        unpermute_rope_rows(np.zeros((6, 2), dtype=np.float32), num_heads=2)
    assert info.value.field == "model"


@pytest.mark.parametrize(
    ("gguf_name", "expected_hf_name"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight"),
        ("blk.2.attn_v.weight", "model.layers.2.self_attn.v_proj.weight"),
        ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
        ("blk.4.ffn_gate.weight", "model.layers.4.mlp.gate_proj.weight"),
        ("blk.5.ffn_up.weight", "model.layers.5.mlp.up_proj.weight"),
        ("blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight"),
        ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
        ("blk.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight"),
    ],
)
def test_hf_tensor_name_maps_llama_cpp_names(gguf_name, expected_hf_name):
    assert hf_tensor_name(gguf_name) == expected_hf_name


def test_hf_tensor_name_rejects_unknown_tensor():
    with pytest.raises(ConfigurationError, match="unsupported GGUF tensor 'rope_freqs.weight'"):
        hf_tensor_name("rope_freqs.weight")


def test_read_hyperparams_reads_every_field(tmp_path):
    reader = gguf.GGUFReader(write_tiny_gguf(tmp_path / "tiny.gguf"))
    assert read_hyperparams(reader) == TINY_PARAMS


def test_read_hyperparams_rejects_other_architectures(tmp_path):
    reader = gguf.GGUFReader(write_tiny_gguf(tmp_path / "tiny.gguf", architecture="gpt2"))
    with pytest.raises(ConfigurationError, match="GGUF architecture 'gpt2' is not 'llama'"):
        read_hyperparams(reader)


def test_read_hf_weights_renames_reorients_and_unpermutes(tmp_path):
    reader = gguf.GGUFReader(write_tiny_gguf(tmp_path / "tiny.gguf"))
    weights = read_hf_weights(reader, TINY_PARAMS)
    assert sorted(weights) == [
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.q_proj.weight",
    ]
    assert np.array_equal(weights["model.layers.0.self_attn.q_proj.weight"], HF_Q)
    assert np.array_equal(weights["model.layers.0.self_attn.k_proj.weight"], HF_K)
    assert weights["model.layers.0.mlp.down_proj.weight"].shape == (8, 16)
    assert weights["model.layers.0.mlp.down_proj.weight"].dtype == np.float32


def test_build_config_is_a_llama_config():
    assert build_config(TINY_PARAMS, is_tied=True) == {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 4,
        "max_position_embeddings": 32,
        "rope_theta": 100000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
        "rms_norm_eps": 1e-05,
        "vocab_size": 3,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": None,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def test_convert_rejects_missing_file(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist") as info:
        convert_gguf_to_hf(tmp_path / "absent.gguf", tmp_path / "out")
    assert info.value.field == "model"


def test_failed_conversion_leaves_nothing_behind(tmp_path):
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf", architecture="gpt2")
    cache_dir = tmp_path / "cache"
    with pytest.raises(ConfigurationError):
        convert_gguf_to_hf(gguf_path, cache_dir / "out")
    assert list(cache_dir.iterdir()) == []


def test_conversion_removes_folders_abandoned_by_a_killed_process(tmp_path):
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf", architecture="gpt2")
    cache_dir = tmp_path / "cache"
    abandoned = [cache_dir / ".staging-out-abcd1234", cache_dir / ".stale-out-abcd1234"]
    other_entry = cache_dir / ".staging-out-2-abcd1234"
    for folder in [*abandoned, other_entry]:
        folder.mkdir(parents=True)
    with pytest.raises(ConfigurationError):
        convert_gguf_to_hf(gguf_path, cache_dir / "out")
    assert list(cache_dir.iterdir()) == [other_entry]
