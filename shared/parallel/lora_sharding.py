"""Cut a LoRA adapter's weights into one rank's shard, as its base layers are cut (sharding.py).

A delta `(x A^T) B^T` follows its base projection. Column-parallel projections (q, k, v, gate,
up: each rank computes some output columns) keep this rank's rows of B (its heads, its half of
the MLP columns) and all of A: every rank holds the whole input. Row-parallel projections
(o_proj, down_proj: each rank holds some input columns, the outputs are summed across ranks)
keep this rank's columns of A and all of B: each rank's partial delta `(x_r A_r^T) B^T` is added
to its partial output before the all-reduce, and the sum over ranks is the whole delta.
Pipeline parallelism keeps the stage's layers, renumbered from 0, as the model shard does.
"""

import torch

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")

# (layer index, peft module name) -> (A: rank x in, scaled B: out x rank), as AdapterWeights holds them.
AdapterModules = dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def shard_adapter(modules: AdapterModules, tensor_rank: int, tensor_parallel_size: int,
                  layers: range) -> AdapterModules:
    """Rank (tensor_rank, stage owning `layers`)'s part of an adapter, under local layer numbers."""
    shard = {}
    for (layer, module), (lora_a, lora_b) in modules.items():
        if layer not in layers:
            continue
        if module in COLUMN_PARALLEL:
            lora_b = _rank_chunk(lora_b, 0, tensor_rank, tensor_parallel_size)
        elif module in ROW_PARALLEL:
            lora_a = _rank_chunk(lora_a, 1, tensor_rank, tensor_parallel_size)
        else:
            raise ValueError(f"no tensor-parallel split known for LoRA module {module!r}")
        shard[(layer - layers.start, module)] = (lora_a, lora_b)
    return shard


def _rank_chunk(tensor: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    """This rank's equal slice along `dim` (heads are contiguous, so a chunk of q/k/v rows is this
    rank's heads, the same split `_shard_qkv` makes of the fused weight)."""
    if size == 1:
        return tensor
    if tensor.shape[dim] % size:
        raise ValueError(f"a LoRA weight of shape {tuple(tensor.shape)} does not split {size} ways along dim {dim}")
    return tensor.chunk(size, dim=dim)[rank].contiguous()
