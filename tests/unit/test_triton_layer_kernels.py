"""The Triton RMSNorm (+ residual) and rotary kernels against float64 references and the model's
own torch implementations (shared/model/llama.py, shared/model/rotary.py)."""

from tests.unit.triton_setup import DEVICE, KERNEL_DTYPES, TOLERANCE  # noqa: I001  (skips without triton)

import pytest
import torch

from shared.attention.triton_kernels.rms_norm import rms_norm
from shared.attention.triton_kernels.rotary import apply_rotary_inplace
from shared.model.rotary import RotaryEmbedding, apply_rotary

HIDDEN = 48  # not a power of two: the kernel masks the padded columns
EPS = 1e-5


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight.double()


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_rms_norm_matches_float64_reference(dtype):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(37, HIDDEN, generator=generator).to(dtype)  # several programs, the last partial
    weight = (1 + torch.randn(HIDDEN, generator=generator) / 4).to(dtype)
    output = rms_norm(x.to(DEVICE), weight.to(DEVICE), EPS).cpu()
    assert output.dtype == dtype
    torch.testing.assert_close(output.double(), reference_rms_norm(x, weight), rtol=0, atol=10 * TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_fused_residual_add_updates_the_residual_and_normalizes_the_sum(dtype):
    generator = torch.Generator().manual_seed(1)
    x, residual = (torch.randn(19, HIDDEN, generator=generator).to(dtype) for _ in range(2))
    weight = torch.rand(HIDDEN, generator=generator).to(dtype)
    residual_on_device = residual.to(DEVICE, copy=True)
    output = rms_norm(x.to(DEVICE), weight.to(DEVICE), EPS, residual=residual_on_device).cpu()
    summed = x + residual  # rounded to dtype, as the model's in-place add
    assert torch.equal(residual_on_device.cpu(), summed)
    torch.testing.assert_close(output.double(), reference_rms_norm(summed, weight), rtol=0,
                               atol=10 * TOLERANCE[dtype])


def test_rms_norm_with_an_empty_batch_returns_an_empty_tensor():
    assert rms_norm(torch.empty(0, HIDDEN, device=DEVICE), torch.ones(HIDDEN, device=DEVICE), EPS).shape == (0, HIDDEN)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_rotary_matches_the_model_rotation_in_float64(dtype):
    head_dim, num_heads = 16, 3
    rotary = RotaryEmbedding(head_dim, max_positions=64, theta=10000.0)
    generator = torch.Generator().manual_seed(2)
    # Query and key heads side by side in a wider row, as they sit inside the fused qkv output.
    qkv = torch.randn(6, (num_heads + 1) * head_dim, generator=generator).to(dtype)
    positions = torch.tensor([0, 1, 17, 5, 63, 40])
    heads = qkv.to(DEVICE, copy=True)[:, :num_heads * head_dim].view(6, num_heads, head_dim)
    half = head_dim // 2
    apply_rotary_inplace(heads, positions.to(DEVICE), rotary.cos_table[:, :half].to(DEVICE),
                         rotary.signed_sin_table[:, half:].to(DEVICE))
    expected = apply_rotary(qkv[:, :num_heads * head_dim].view(6, num_heads, head_dim).double(),
                            rotary.lookup(positions, torch.float64))
    torch.testing.assert_close(heads.cpu().double(), expected, rtol=0, atol=TOLERANCE[dtype] * 4)
