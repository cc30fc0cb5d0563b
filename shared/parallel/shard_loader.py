"""Build one rank's model: its stage's layers, its tensor-parallel shard of each.

Every rank reads the checkpoint, keeps its shard (sharding.py), builds a `LlamaForCausalLM`
with the local shapes (its heads, its MLP columns, its vocabulary slice, its layers), packs it
for the CPU like `load_model` does, then swaps in the communicating layers (layers.py).
"""

from collections.abc import Callable
from pathlib import Path

import torch

from shared.model.config import ModelConfig
from shared.model.cpu_runtime import keep_freed_memory_in_process
from shared.model.llama import LlamaForCausalLM
from shared.model.loader import _check_names, fuse_hf_weights, read_safetensors
from shared.model.packed_linear import pack_for_cpu
from shared.parallel.config import stage_layers
from shared.parallel.groups import ParallelGroups
from shared.parallel.layers import make_tensor_parallel
from shared.parallel.sharding import local_config, shard_state


def load_model_shard(folder: Path | str, dtype: torch.dtype, groups: ParallelGroups, fuse_mlp: bool = True,
                     before_parallel: Callable[[LlamaForCausalLM], None] | None = None
                     ) -> tuple[LlamaForCausalLM, ModelConfig]:
    """(this rank's model, its local config: per-rank heads, the stage's layer count).
    `fuse_mlp=False` keeps gate/up and down apart (LoRA); `before_parallel(model)` runs on the
    packed shard before the communicating layers go in (LoRA layers go inside the all-reduce)."""
    folder = Path(folder)
    config = ModelConfig.from_folder(folder)
    layers = stage_layers(config.num_layers, groups.pipeline_parallel_size, groups.stage)
    shard_config = local_config(config, groups.tensor_parallel_size, layers)
    with torch.device("meta"):
        model = LlamaForCausalLM(shard_config)
    state = shard_state(fuse_hf_weights(read_safetensors(folder), config), config,
                        groups.tensor_rank, groups.tensor_parallel_size, layers)
    state = {name: tensor.to(dtype) for name, tensor in state.items()}
    _check_names(model, state, shard_config)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    model.eval().requires_grad_(False)
    pack_for_cpu(model, fuse_mlp=fuse_mlp)
    if before_parallel is not None:
        before_parallel(model)
    make_tensor_parallel(model, groups, config.vocab_size)
    keep_freed_memory_in_process()
    return model, shard_config
