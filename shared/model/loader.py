"""Load an HF Llama folder (config.json + *.safetensors) into `LlamaForCausalLM`.

The engine calls `load_model` once at start-up. HF checkpoints hold separate q/k/v and
gate/up projections; they are concatenated here into the model's fused `qkv_proj` and
`gate_up_proj`, cast to the requested dtype and moved to the requested device. On the CPU, bf16
linear weights are then packed for oneDNN and loading tunes the process's allocator for the
model's large per-step temporaries (`keep_freed_memory_in_process`, 17% off the offline
benchmark's wall time); on a GPU neither applies.
"""

import logging
import re
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from shared.attention.backend import AttentionBackend
from shared.errors import ConfigurationError
from shared.model.config import ModelConfig
from shared.model.cpu_runtime import bound_onednn_caches, keep_freed_memory_in_process
from shared.model.llama import LlamaForCausalLM
from shared.model.packed_linear import pack_for_cpu

logger = logging.getLogger(__name__)

SUPPORTED_DTYPES = (torch.bfloat16, torch.float32)
FUSED_PROJECTIONS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
# Checkpoint entries that hold no weights of ours (old checkpoints store RoPE frequencies).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_model(folder: Path | str, dtype: torch.dtype = torch.bfloat16, num_layers: int | None = None,
               device: torch.device | str = "cpu",
               attn_backend: AttentionBackend | None = None,
               deterministic: bool = False, fuse_mlp: bool = True) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Build the model from `folder` in `dtype` (bf16 or float32) on `device`, ready for inference.

    `num_layers` keeps only the first N decoder layers (with the final norm and LM head): a
    cheap draft model for speculative decoding made from the target itself. `attn_backend`
    defaults to the CPU's torch paged attention. `deterministic` packs the CPU's linear layers
    for deterministic mode (fp32 compute, shared/native/cpu_matmul.py). `fuse_mlp=False` keeps the
    MLP's gate/up projection a linear layer of its own (LoRA adapts its output)."""
    if dtype not in SUPPORTED_DTYPES:
        raise ConfigurationError("dtype", f"{dtype} is not one of {SUPPORTED_DTYPES}")
    bound_onednn_caches()  # before the first oneDNN primitive (packing below creates some)
    folder = Path(folder)
    config = _truncated(ModelConfig.from_folder(folder), num_layers)
    device = torch.device(device)
    with torch.device("meta"):
        model = LlamaForCausalLM(config, attn_backend)
    state = _drop_layers_from(fuse_hf_weights(read_safetensors(folder), config), config.num_layers)
    state = {name: tensor.to(device=device, dtype=dtype) for name, tensor in state.items()}
    _check_names(model, state, config)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    model.eval().requires_grad_(False)
    model.rotary.to(device)
    if device.type == "cpu":
        pack_for_cpu(model, deterministic, fuse_mlp)
        keep_freed_memory_in_process()
    return model, config


def _truncated(config: ModelConfig, num_layers: int | None) -> ModelConfig:
    if num_layers is None:
        return config
    if not 1 <= num_layers <= config.num_layers:
        raise ConfigurationError("draft_num_layers", f"must be in [1, {config.num_layers}], got {num_layers}")
    return replace(config, num_layers=num_layers)


def _drop_layers_from(state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """The weights without those of decoder layers >= num_layers."""
    def layer_of(name: str) -> int | None:
        match = re.match(r"layers\.(\d+)\.", name)
        return int(match.group(1)) if match else None
    return {name: tensor for name, tensor in state.items()
            if layer_of(name) is None or layer_of(name) < num_layers}


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every `*.safetensors` file in the folder, by HF name."""
    paths = sorted(folder.glob("*.safetensors"))
    if not paths:
        raise ConfigurationError("model", f"{folder} has no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for path in paths:
        tensors.update(load_file(str(path)))
    return tensors


def fuse_hf_weights(hf: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """HF names (`model.layers.0.self_attn.q_proj.weight`, ...) -> ours, with q/k/v and
    gate/up concatenated along the output dimension."""
    state = {_strip_prefix(name): tensor for name, tensor in hf.items() if not name.endswith(IGNORED_SUFFIXES)}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for layer_index in range(config.num_layers):
        for fused, parts in FUSED_PROJECTIONS.items():
            for kind in ("weight", "bias"):
                part_names = [f"layers.{layer_index}.{part}.{kind}" for part in parts]
                if all(name in state for name in part_names):
                    state[f"layers.{layer_index}.{fused}.{kind}"] = torch.cat([state.pop(n) for n in part_names])
    return state


def _strip_prefix(name: str) -> str:
    return name.removeprefix("model.")


def _check_names(model: LlamaForCausalLM, state: dict[str, torch.Tensor], config: ModelConfig) -> None:
    expected = {name: param.shape for name, param in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ConfigurationError("model", f"weights do not fit a Llama model: missing {missing[:5]}, "
                                           f"unexpected {unexpected[:5]}")
    for name, shape in expected.items():
        if state[name].shape != shape:
            raise ConfigurationError("model", f"weight {name} has shape {tuple(state[name].shape)}, "
                                               f"expected {tuple(shape)}")
