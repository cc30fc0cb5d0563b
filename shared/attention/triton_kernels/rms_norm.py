"""RMSNorm, optionally fused with the residual add that precedes it in a decoder layer.

Rounding follows transformers' LlamaRMSNorm in 16-bit dtypes: the residual sum is rounded to
the activations' dtype, normalized in float32, rounded again, then scaled by the weight.
One program normalizes a few rows (as many as fit ROW_ELEMENTS).
"""

import torch
import triton
import triton.language as tl

# Elements one program holds at once: rows per program = this // the padded hidden size.
ROW_ELEMENTS = 4096
MAX_ROWS_PER_PROGRAM = 16


@triton.jit
def _rms_norm_kernel(x, residual, weight, output, num_rows, stride_x, stride_residual, stride_out, hidden_size,
                     eps, HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    inside = (rows < num_rows)[:, None] & (columns < hidden_size)[None, :]
    values = tl.load(x + rows[:, None] * stride_x + columns[None, :], mask=inside, other=0.0)
    if HAS_RESIDUAL:
        residual_rows = residual + rows[:, None] * stride_residual + columns[None, :]
        summed = values.to(tl.float32) + tl.load(residual_rows, mask=inside, other=0.0).to(tl.float32)
        values = summed.to(x.dtype.element_ty)
        tl.store(residual_rows, values, mask=inside)
    values = values.to(tl.float32)
    inverse_rms = 1.0 / tl.sqrt(tl.sum(values * values, axis=1) / hidden_size + eps)
    normed = (values * inverse_rms[:, None]).to(x.dtype.element_ty).to(tl.float32)
    scale = tl.load(weight + columns, mask=columns < hidden_size, other=0.0).to(tl.float32)
    tl.store(output + rows[:, None] * stride_out + columns[None, :],
             (normed * scale[None, :]).to(output.dtype.element_ty), mask=inside)


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
    block = triton.next_power_of_2(hidden_size)
    rows_per_program = max(1, min(MAX_ROWS_PER_PROGRAM, ROW_ELEMENTS // block))
    has_residual = residual is not None
    _rms_norm_kernel[(triton.cdiv(num_rows, rows_per_program),)](
        x, residual if has_residual else x, weight, output, num_rows, x.stride(0),
        residual.stride(0) if has_residual else 0, output.stride(0), hidden_size, eps,
        HAS_RESIDUAL=has_residual, ROWS=rows_per_program, BLOCK=block)
    return output
