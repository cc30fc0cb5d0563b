"""The model's RMSNorm and rotary embedding as Triton kernels (used with the Triton attention
backend, i.e. on CUDA). Triton is imported on first use, so CPU-only installs never need it."""

import torch

from shared.model.rotary import RotaryTables


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None) -> torch.Tensor:
    from shared.attention.triton_kernels.rms_norm import rms_norm as triton_rms_norm

    return triton_rms_norm(x, weight, eps, residual)


def rotate_in_place(x: torch.Tensor, tables: RotaryTables) -> torch.Tensor:
    """Rotate (num_tokens, num_heads, head_dim) x in place by the step's per-token tables."""
    from shared.attention.triton_kernels.rotary import apply_rotary_inplace

    num_tokens, _, head_dim = x.shape
    half = head_dim // 2
    cos = tables.cos.view(num_tokens, head_dim)[:, :half]
    sin = tables.signed_sin.view(num_tokens, head_dim)[:, half:]
    rows = torch.arange(num_tokens, device=x.device)
    return apply_rotary_inplace(x, rows, cos, sin)
