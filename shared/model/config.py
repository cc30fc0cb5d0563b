"""The Llama hyper-parameters pdserve needs, read from an HF model folder's `config.json`.

`load_model` (shared/model/loader.py) builds the network from a `ModelConfig`; the engine reads
`vocab_size`, `max_position_embeddings` and `eos_token_ids` from it to validate requests, and the
KV-cache layout reads `num_layers`, `num_kv_heads` and `head_dim`.
"""

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shared.errors import ConfigurationError

SUPPORTED_ROPE_TYPES = (None, "default")
DEFAULT_MAX_POSITION_EMBEDDINGS = 2048


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    attention_bias: bool = False
    mlp_bias: bool = False

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_folder(cls, folder: Path | str) -> "ModelConfig":
        """Read `config.json`, adding the eos ids of `generation_config.json` when present."""
        folder = Path(folder)
        config_path = folder / "config.json"
        if not config_path.is_file():
            raise ConfigurationError("model", f"{folder} has no config.json")
        config = cls.from_hf_dict(json.loads(config_path.read_text()))
        generation_path = folder / "generation_config.json"
        if generation_path.is_file():
            extra_ids = _as_id_list(json.loads(generation_path.read_text()).get("eos_token_id"))
            merged = config.eos_token_ids + tuple(i for i in extra_ids if i not in config.eos_token_ids)
            config = replace(config, eos_token_ids=merged)
        return config

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Build from the dict of an HF Llama `config.json`; unsupported features raise."""
        _check_architecture(hf)
        num_heads = _required(hf, "num_attention_heads")
        hidden_size = _required(hf, "hidden_size")
        num_kv_heads = hf.get("num_key_value_heads") or num_heads
        if num_heads % num_kv_heads:
            raise ConfigurationError("model", f"num_attention_heads={num_heads} is not a multiple "
                                               f"of num_key_value_heads={num_kv_heads}")
        return cls(
            vocab_size=_required(hf, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=_required(hf, "intermediate_size"),
            num_layers=_required(hf, "num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=hf.get("head_dim") or hidden_size // num_heads,
            rope_theta=float(_rope_theta(hf)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=hf.get("max_position_embeddings") or DEFAULT_MAX_POSITION_EMBEDDINGS,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=tuple(_as_id_list(hf.get("eos_token_id"))),
            attention_bias=bool(hf.get("attention_bias", False)),
            mlp_bias=bool(hf.get("mlp_bias", False)),
        )


def _check_architecture(hf: dict[str, Any]) -> None:
    model_type = hf.get("model_type", "llama")
    if model_type != "llama":
        raise ConfigurationError("model", f"model_type {model_type!r} is not supported (only 'llama')")
    activation = hf.get("hidden_act", "silu")
    if activation != "silu":
        raise ConfigurationError("model", f"hidden_act {activation!r} is not supported (only 'silu')")


def _rope_theta(hf: dict[str, Any]) -> float:
    """transformers >= 5 keeps RoPE settings in `rope_parameters`; older configs use
    top-level `rope_theta` plus an optional `rope_scaling`."""
    parameters = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    for settings in (parameters, scaling):
        rope_type = settings.get("rope_type", settings.get("type"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ConfigurationError("model", f"rope type {rope_type!r} is not supported "
                                               "(only plain RoPE without scaling)")
    return parameters.get("rope_theta", hf.get("rope_theta", 10000.0))


def _required(hf: dict[str, Any], key: str) -> int:
    if hf.get(key) is None:
        raise ConfigurationError("model", f"config.json lacks {key!r}")
    return hf[key]


def _as_id_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)
