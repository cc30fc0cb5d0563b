"""Reading `ModelConfig` from HF config dicts and folders."""

import json

import pytest

from shared.errors import ConfigurationError
from shared.model.config import ModelConfig

SMOLLM2_LIKE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2,
}


def with_changes(**changes) -> dict:
    return {**SMOLLM2_LIKE, **changes}


def test_reads_every_field_of_an_older_style_config():
    config = ModelConfig.from_hf_dict(SMOLLM2_LIKE)
    assert config == ModelConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
        max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,))
    assert config.num_queries_per_kv == 3


def test_rope_theta_comes_from_rope_parameters_in_transformers_5_configs():
    hf = with_changes(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    del hf["rope_theta"]
    assert ModelConfig.from_hf_dict(hf).rope_theta == 500000.0


def test_explicit_head_dim_and_eos_list_are_kept():
    config = ModelConfig.from_hf_dict(with_changes(head_dim=32, eos_token_id=[2, 7]))
    assert config.head_dim == 32
    assert config.eos_token_ids == (2, 7)


@pytest.mark.parametrize("changes, message", [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope type 'llama3' is not supported"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope type 'linear' is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope type 'yarn' is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"model_type": "mistral"}, "model_type 'mistral' is not supported"),
    ({"num_key_value_heads": 2}, "num_attention_heads=9 is not a multiple of num_key_value_heads=2"),
    ({"vocab_size": None}, "config.json lacks 'vocab_size'"),
])
def test_unsupported_configs_are_rejected_naming_the_setting(changes, message):
    with pytest.raises(ConfigurationError) as error:
        ModelConfig.from_hf_dict(with_changes(**changes))
    assert error.value.field == "model"
    assert message in error.value.message


def test_default_rope_scaling_is_accepted():
    config = ModelConfig.from_hf_dict(with_changes(rope_scaling={"rope_type": "default"}))
    assert config.rope_theta == 100000.0


def test_folder_adds_generation_config_eos_ids(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_LIKE))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 9]}))
    assert ModelConfig.from_folder(tmp_path).eos_token_ids == (2, 9)


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(ConfigurationError, match="has no config.json") as error:
        ModelConfig.from_folder(tmp_path)
    assert error.value.field == "model"


def test_tiny_checkpoint_config(tiny_llama_folder):
    config = ModelConfig.from_folder(tiny_llama_folder)
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (2, 4, 2, 16)
    assert (config.vocab_size, config.rope_theta, config.tie_word_embeddings) == (256, 10000.0, True)
    assert config.eos_token_ids == (2,)
