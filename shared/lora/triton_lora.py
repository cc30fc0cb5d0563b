"""Triton kernels for LoRA on the GPU: one launch per adapted sub-module, every segment at once.

The CPU path (shared.lora.layers) runs two small torch matmuls per row segment. On a GPU that
is two kernel launches per segment and sub-module, so `add_lora_deltas` does each
sub-module's work for all segments in two launches over stacked, zero-padded weights:

- shrink: `shrunk[rows] = x[rows] @ A[slot]^T` (float32, rank padded to BLOCK_R), one program
  per (segment, tile of rows);
- expand: `out[rows, columns] += shrunk[rows] @ B[slot]^T`, one program per (segment, tile of
  rows, tile of output columns); the sum is taken in float32 and rounded to `out`'s dtype once.

Padding the rank with zero rows of A and zero columns of B adds exact zeros. Segments come as
three int32 tensors (first row, end row, slot). Tested under TRITON_INTERPRET=1 against a
float64 reference (tests/unit/test_lora_triton.py), as the attention kernels are.
"""

import torch
import triton
import triton.language as tl

BLOCK_M = 16
BLOCK_N = 64
BLOCK_K = 32


@triton.jit
def _shrink_kernel(x, lora_a, seg_first, seg_end, seg_slot, shrunk, in_features, rank,
                   stride_x, stride_a_slot, stride_a_rank, stride_shrunk,
                   BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    segment, tile = tl.program_id(0), tl.program_id(1)
    first = tl.load(seg_first + segment)
    end = tl.load(seg_end + segment)
    slot = tl.load(seg_slot + segment).to(tl.int64)
    rows = first + tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < end
    ranks = tl.arange(0, BLOCK_R)
    rank_ok = ranks < rank
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    for start in range(0, in_features, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_ok = ks < in_features
        x_tile = tl.load(x + rows[:, None].to(tl.int64) * stride_x + ks[None, :],
                         mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        a_tile = tl.load(lora_a + slot * stride_a_slot + ranks[None, :] * stride_a_rank + ks[:, None],
                         mask=k_ok[:, None] & rank_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(x_tile, a_tile, input_precision="ieee")
    tl.store(shrunk + rows[:, None].to(tl.int64) * stride_shrunk + ranks[None, :], acc,
             mask=row_ok[:, None] & rank_ok[None, :])


@triton.jit
def _expand_kernel(shrunk, lora_b, seg_first, seg_end, seg_slot, out, column_start, out_features, rank,
                   stride_shrunk, stride_b_slot, stride_b_out, stride_out,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    segment, tile, column_tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    first = tl.load(seg_first + segment)
    end = tl.load(seg_end + segment)
    slot = tl.load(seg_slot + segment).to(tl.int64)
    rows = first + tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < end
    columns = column_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    column_ok = columns < out_features
    ranks = tl.arange(0, BLOCK_R)
    rank_ok = ranks < rank
    s_tile = tl.load(shrunk + rows[:, None].to(tl.int64) * stride_shrunk + ranks[None, :],
                     mask=row_ok[:, None] & rank_ok[None, :], other=0.0)
    b_tile = tl.load(lora_b + slot * stride_b_slot + columns[None, :] * stride_b_out + ranks[:, None],
                     mask=rank_ok[:, None] & column_ok[None, :], other=0.0).to(tl.float32)
    delta = tl.dot(s_tile, b_tile, input_precision="ieee")
    targets = out + rows[:, None].to(tl.int64) * stride_out + column_start + columns[None, :]
    mask = row_ok[:, None] & column_ok[None, :]
    previous = tl.load(targets, mask=mask, other=0.0).to(tl.float32)
    tl.store(targets, (previous + delta).to(out.dtype.element_ty), mask=mask)


def segment_tensors(segments: list[tuple[int, int, int]], device: torch.device) -> tuple[torch.Tensor, ...]:
    """(first rows, end rows, slots) as int32 tensors on `device`."""
    table = torch.tensor(segments, dtype=torch.int32).reshape(-1, 3).T.contiguous()
    return tuple(column.to(device) for column in table)


def add_lora_deltas(out: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                    segments: tuple[torch.Tensor, ...], max_segment_rows: int, column_start: int) -> None:
    """`out[r, column_start:+out_features] += (x[r] @ A[slot]^T) @ B[slot]^T` for every row r of
    every segment, in place. lora_a: (slots, rank, in); lora_b: (slots, out_features, rank),
    zero-padded to a common rank; x and out: row-major (rows, features)."""
    num_segments = segments[0].numel()
    if num_segments == 0 or max_segment_rows == 0:
        return
    num_slots, rank, in_features = lora_a.shape
    out_features = lora_b.shape[1]
    block_r = max(16, triton.next_power_of_2(rank))
    shrunk = torch.empty(x.shape[0], block_r, dtype=torch.float32, device=x.device)
    row_tiles = triton.cdiv(max_segment_rows, BLOCK_M)
    _shrink_kernel[(num_segments, row_tiles)](
        x, lora_a, *segments, shrunk, in_features, rank, x.stride(0), lora_a.stride(0), lora_a.stride(1),
        shrunk.stride(0), BLOCK_M=BLOCK_M, BLOCK_R=block_r, BLOCK_K=BLOCK_K)
    _expand_kernel[(num_segments, row_tiles, triton.cdiv(out_features, BLOCK_N))](
        shrunk, lora_b, *segments, out, column_start, out_features, rank, shrunk.stride(0), lora_b.stride(0),
        lora_b.stride(1), out.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_R=block_r)
