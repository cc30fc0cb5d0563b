"""The model's RMSNorms and rotary embedding, in one of three implementations.

`LlamaForCausalLM` picks one when it is built (`select_layer_ops`): the Triton kernels when its
attention backend runs on CUDA (`fused_layer_ops`), the C++ ones on the CPU
(cpu_layer_ops.py) where they build, else plain torch. All three round as transformers' Llama
does: RMSNorm normalizes in fp32, rounds, then multiplies by the weight and rounds again; the
rotary embedding rounds x * cos and rotate_half(x) * sin before adding them.
"""

from typing import Protocol

import torch
import torch.nn.functional as F

from shared.attention.backend import AttentionBackend
from shared.model import triton_layer_ops
from shared.model.cpu_layer_ops import load_cpu_layer_ops
from shared.model.rotary import RotaryTables, apply_rotary


class LayerOps(Protocol):
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
        """RMSNorm of x's rows; with `residual`, first `residual += x` (in place), normalize that."""

    def rotate(self, x: torch.Tensor, tables: RotaryTables) -> torch.Tensor:
        """x (tokens, heads, head_dim) rotated by each token's tables; may rotate x in place."""


class TorchLayerOps:
    def rms_norm(self, x, weight, eps, residual=None):
        if residual is not None:
            x = residual.add_(x)
        return F.rms_norm(x, weight.shape, None, eps) * weight

    def rotate(self, x, tables):
        return apply_rotary(x, tables)


class TritonLayerOps:
    def rms_norm(self, x, weight, eps, residual=None):
        return triton_layer_ops.rms_norm(x, weight, eps, residual)

    def rotate(self, x, tables):
        return triton_layer_ops.rotate_in_place(x, tables)


def describe_layer_ops(ops: LayerOps) -> str:
    return {TorchLayerOps: "torch", TritonLayerOps: "Triton"}.get(type(ops), "C++")


def select_layer_ops(backend: AttentionBackend, head_dim: int) -> LayerOps:
    if backend.fused_layer_ops:
        return TritonLayerOps()
    cpu_ops = load_cpu_layer_ops() if backend.runs_on_cpu else None
    if cpu_ops is not None and cpu_ops.supports(torch.bfloat16, head_dim):
        return cpu_ops
    return TorchLayerOps()
