"""Cut a full (fused) Llama state dict into one rank's shard.

Tensor parallelism (Megatron's split): the fused QKV projection keeps this rank's query heads
and the KV heads they read (heads are contiguous per KV group, so rank r's query heads use
exactly rank r's KV heads); gate/up keep this rank's columns of each half; o_proj and down_proj
keep the matching input columns (their outputs are partial sums, all-reduced by the layer);
embedding and LM head keep this rank's slice of the vocabulary (padded to a multiple of the
rank count). Pipeline parallelism keeps the stage's layers, renumbered from 0.
"""

import re
from dataclasses import replace

import torch

from shared.errors import ConfigurationError
from shared.model.config import ModelConfig

_LAYER = re.compile(r"layers\.(\d+)\.(.*)")
VOCAB_PARALLEL = ("embed_tokens.weight", "lm_head.weight")


def shard_vocab_size(vocab_size: int, tensor_parallel_size: int) -> int:
    return -(-vocab_size // tensor_parallel_size)


def local_config(config: ModelConfig, tensor_parallel_size: int, layers: range) -> ModelConfig:
    """The shapes one rank's model has (the head count per rank, the stage's layers)."""
    tp = tensor_parallel_size
    if config.intermediate_size % tp:
        raise ConfigurationError("tensor_parallel_size", f"{tp} must divide the model's "
                                                          f"intermediate size {config.intermediate_size}")
    return replace(config, num_heads=config.num_heads // tp, num_kv_heads=config.num_kv_heads // tp,
                   intermediate_size=config.intermediate_size // tp,
                   vocab_size=shard_vocab_size(config.vocab_size, tp), num_layers=len(layers))


def shard_state(state: dict[str, torch.Tensor], config: ModelConfig, tensor_rank: int,
                tensor_parallel_size: int, layers: range) -> dict[str, torch.Tensor]:
    """Rank (tensor_rank, stage owning `layers`)'s tensors, under the local model's names."""
    shard = {}
    for name, tensor in state.items():
        match = _LAYER.match(name)
        if match is None:
            shard[name] = _shard_top_level(name, tensor, config, tensor_rank, tensor_parallel_size)
        elif int(match.group(1)) in layers:
            local_name = f"layers.{int(match.group(1)) - layers.start}.{match.group(2)}"
            shard[local_name] = _shard_layer_tensor(match.group(2), tensor, config, tensor_rank,
                                                    tensor_parallel_size)
    return shard


def _shard_top_level(name: str, tensor: torch.Tensor, config: ModelConfig, rank: int, size: int) -> torch.Tensor:
    if name not in VOCAB_PARALLEL or size == 1:
        return tensor
    rows = shard_vocab_size(config.vocab_size, size)
    padded = torch.zeros(rows * size, *tensor.shape[1:], dtype=tensor.dtype)
    padded[:tensor.shape[0]] = tensor
    return padded[rank * rows:(rank + 1) * rows].clone()


def _shard_layer_tensor(suffix: str, tensor: torch.Tensor, config: ModelConfig, rank: int, size: int) -> torch.Tensor:
    if size == 1:
        return tensor
    if suffix.startswith("self_attn.qkv_proj."):
        return _shard_qkv(tensor, config, rank, size)
    if suffix.startswith("mlp.gate_up_proj."):
        gate, up = tensor.chunk(2)
        return torch.cat([gate.chunk(size)[rank], up.chunk(size)[rank]]).clone()
    if suffix in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
        return tensor.chunk(size, dim=1)[rank].clone()
    if suffix in ("self_attn.o_proj.bias", "mlp.down_proj.bias"):
        # Added once, after the all-reduce sums the ranks' partial outputs.
        return tensor.clone() if rank == 0 else torch.zeros_like(tensor)
    return tensor


def _shard_qkv(tensor: torch.Tensor, config: ModelConfig, rank: int, size: int) -> torch.Tensor:
    head_dim = config.head_dim
    query, key, value = tensor.split([config.num_heads * head_dim, config.num_kv_heads * head_dim,
                                      config.num_kv_heads * head_dim])
    return torch.cat([query.chunk(size)[rank], key.chunk(size)[rank], value.chunk(size)[rank]]).clone()
