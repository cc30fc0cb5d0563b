"""RMSNorm, optionally fused with the residual add that precedes it in a decoder layer.

Rounding follows transformers' LlamaRMSNorm in 16-bit dtypes: the residual sum is rounded to
the activations' dtype, normalized in float32, rounded again, then scaled by the weight.
One program normalizes one row.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x, residual, weight, output, stride_x, stride_residual, stride_out, hidden_size, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    inside = columns < hidden_size
    values = tl.load(x + row * stride_x + columns, mask=inside, other=0.0)
    if HAS_RESIDUAL:
        summed = values.to(tl.float32) + tl.load(residual + row * stride_residual + columns, mask=inside,
                                                 other=0.0).to(tl.float32)
        values = summed.to(x.dtype.element_ty)
        tl.store(residual + row * stride_residual + columns, values, mask=inside)
    values = values.to(tl.float32)
    inverse_rms = 1.0 / tl.sqrt(tl.sum(values * values, axis=0) / hidden_size + eps)
    normed = (values * inverse_rms).to(x.dtype.element_ty).to(tl.float32)
    scale = tl.load(weight + columns, mask=inside, other=0.0).to(tl.float32)
    tl.store(output + row * stride_out + columns, (normed * scale).to(output.dtype.element_ty), mask=inside)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """Normalize the rows of x (num_rows, hidden). With `residual` (same shape), first
    `residual += x` in place and normalize that sum instead. Returns a new tensor."""
    if x.stride(-1) != 1 or (residual is not None and residual.stride(-1) != 1):
        raise ValueError("x/residual: the hidden dimension must be contiguous")
    num_rows, hidden_size = x.shape
    output = torch.empty_like(x)
    if num_rows == 0:
        return output
    has_residual = residual is not None
    _rms_norm_kernel[(num_rows,)](
        x, residual if has_residual else x, weight, output, x.stride(0),
        residual.stride(0) if has_residual else 0, output.stride(0), hidden_size, eps,
        HAS_RESIDUAL=has_residual, BLOCK=triton.next_power_of_2(hidden_size))
    return output
