"""ComputePaths (compute_paths.py) of a loaded model, or of the engine these shapes would make."""

import torch

from shared.attention.backend import AttentionBackend
from shared.model.compute_paths import ComputePaths
from shared.model.layer_ops import LayerOps, describe_layer_ops
from shared.native.cpu_info import onednn_bf16_engine


def describe_matmul(device: torch.device, model_dtype: torch.dtype, compute_dtype: torch.dtype) -> str:
    if device.type != "cpu":
        return f"{str(model_dtype).removeprefix('torch.')} (torch on {device})"
    compute = str(compute_dtype).removeprefix("torch.")
    if compute_dtype == torch.bfloat16:
        return f"{compute} (oneDNN on {onednn_bf16_engine()})"
    if model_dtype == torch.bfloat16:
        return f"{compute} (oneDNN, bf16 weights and activations widened)"
    return f"{compute} (oneDNN)"


def compute_paths(device: torch.device, model_dtype: torch.dtype, compute_dtype: torch.dtype,
                  backend: AttentionBackend, block_size: int, layer_ops: LayerOps) -> ComputePaths:
    decode, prompt = backend.describe(block_size, model_dtype)
    return ComputePaths(str(device), describe_matmul(device, model_dtype, compute_dtype), decode, prompt,
                        describe_layer_ops(layer_ops))


def describe_model(model: torch.nn.Module, block_size: int) -> ComputePaths:
    """The paths of a loaded LlamaForCausalLM (its packed layers' compute dtype, its backend)."""
    from shared.model.packed_linear import PackedGatedMLP, PackedLinear

    weight = model.embed_tokens.weight
    compute_dtype = next((module.compute_dtype for module in model.modules()
                          if isinstance(module, (PackedLinear, PackedGatedMLP))), weight.dtype)
    return compute_paths(weight.device, weight.dtype, compute_dtype, model.attn_backend, block_size,
                         model.layers[0].self_attn.ops if len(model.layers) else model.norm.ops)


def expected_cpu_paths(num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, block_size: int,
                       deterministic: bool = False) -> ComputePaths:
    """The paths a CPU engine with these shapes (one rank's heads) takes on this machine,
    without loading a model: for parallel workers, and for benchmarks of other processes."""
    from shared.attention.torch_paged import TorchPagedAttention
    from shared.model.layer_ops import select_layer_ops
    from shared.model.packed_linear import can_pack
    from shared.native.cpu_matmul import cpu_matmul_dtype

    backend = TorchPagedAttention(num_heads, num_kv_heads, head_dim, deterministic=deterministic)
    compute_dtype = cpu_matmul_dtype(dtype, deterministic) if can_pack(dtype) else dtype
    return compute_paths(torch.device("cpu"), dtype, compute_dtype, backend, block_size,
                         select_layer_ops(backend, head_dim))
