"""The CPU path of a LoRA layer: every segment's delta in two matmuls per projection.

A step's rows use up to `max_loras` adapters. Looping over segments costs two small matmuls per
segment and sub-module (dispatch-bound: ~20-40 us each at decode sizes, hundreds a step), so the
CPU instead stacks, for the slots the step uses, every adapted sub-module's A into one shrink
weight (K x in, K = the sum of those ranks) and every scaled B into one expand weight (out x K,
each B in its sub-module's output rows and its own K columns, zeros elsewhere). Per projection:

    y = x @ shrink^T            all rows against every active slot's A (rows x K)
    y *= mask                   each row keeps only its own slot's columns (base rows: none)
    out = base(x) + y @ expand^T

Exact (the masked columns and the zeros of the expand weight add exact zeros); the waste is the
other slots' columns, proportional to active slots x rank, small beside the base matmul for the
ranks LoRA uses. The stacked weights are built once per set of active slots (kept for the
last few sets, dropped when a slot is refilled) and, for oneDNN-packed bf16 layers, packed
as the base weight is, so both matmuls take oneDNN's fastest path; the expand adds into the
base output inside the matmul (a binary post-op), rounding once.
"""

from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from shared.model.packed_linear import PackedLinear
from shared.model.row_buckets import pad_rows

_linear_pointwise = torch.ops.mkldnn._linear_pointwise
_CACHED_SLOT_SETS = 4  # stacked weights kept per layer, for this many distinct sets of active slots


@dataclass(frozen=True)
class SlotPiece:
    """One slot's weights of one projection, concatenated over its adapted sub-modules."""

    lora_a: torch.Tensor  # (rank sum) x in
    lora_b: torch.Tensor  # out x (rank sum): each sub-module's scaled B in its rows, zeros elsewhere


@dataclass(frozen=True)
class StackedWeights:
    layout: tuple[tuple[int, int, int], ...]  # (slot, first column, end column) in y
    shrink: torch.Tensor  # packed (K x in) for oneDNN, else in x K
    expand: torch.Tensor  # packed (out x K) for oneDNN, else K x out


def slot_piece(weights: list[tuple[torch.Tensor, torch.Tensor] | None],
               columns: list[tuple[int, int]]) -> SlotPiece | None:
    """The piece of one slot from its per-sub-module (A, scaled B), None where nothing is adapted."""
    adapted = [(pair, span) for pair, span in zip(weights, columns) if pair is not None]
    if not adapted:
        return None
    lora_a = torch.cat([lora_a for (lora_a, _), _ in adapted])
    lora_b = lora_a.new_zeros(columns[-1][1], lora_a.shape[0])
    rank_start = 0
    for (_, b), (start, stop) in adapted:
        lora_b[start:stop, rank_start:rank_start + b.shape[1]] = b
        rank_start += b.shape[1]
    return SlotPiece(lora_a, lora_b)


class CpuDeltas:
    """A LoRALinear's CPU deltas: per-slot pieces, stacked weights per set of active slots."""

    def __init__(self, base: nn.Module, num_slots: int):
        self.packed = base if isinstance(base, PackedLinear) else None
        self.pieces: list[SlotPiece | None] = [None] * num_slots
        self._stacked: OrderedDict[tuple[int, ...], StackedWeights | None] = OrderedDict()

    def set_piece(self, slot: int, piece: SlotPiece | None) -> None:
        self.pieces[slot] = piece
        self._stacked.clear()

    def forward(self, base: nn.Module, x: torch.Tensor, step) -> torch.Tensor:
        """base(x) plus the step's deltas (`step`: the StepAdapters)."""
        stacked = self._stacked_for(step.active_slots())
        if stacked is None:
            return base(x)
        if self.packed is None:
            out = base(x)
            y = x @ stacked.shrink
            y.mul_(step.row_mask(stacked.layout, x.shape[0], y.dtype, y.device))
            return out.addmm_(y, stacked.expand)
        padded = pad_rows(x).to(self.packed.compute_dtype)
        out = self.packed.forward_compute(padded)
        y = _linear_pointwise(padded, stacked.shrink, None, "none", [], "")
        y.mul_(step.row_mask(stacked.layout, padded.shape[0], y.dtype, y.device))
        out = _linear_pointwise.binary(y, out, stacked.expand, None, "add")
        return out[:x.shape[0]].to(self.packed.io_dtype)

    def _stacked_for(self, slots: tuple[int, ...]) -> StackedWeights | None:
        if slots in self._stacked:
            self._stacked.move_to_end(slots)
            return self._stacked[slots]
        stacked = self._stack(slots)
        self._stacked[slots] = stacked
        while len(self._stacked) > _CACHED_SLOT_SETS:
            self._stacked.popitem(last=False)
        return stacked

    def _stack(self, slots: tuple[int, ...]) -> StackedWeights | None:
        present = [(slot, self.pieces[slot]) for slot in slots if self.pieces[slot] is not None]
        if not present:
            return None
        layout, column = [], 0
        for slot, piece in present:
            layout.append((slot, column, column + piece.lora_a.shape[0]))
            column += piece.lora_a.shape[0]
        lora_a = torch.cat([piece.lora_a for _, piece in present])
        lora_b = torch.cat([piece.lora_b for _, piece in present], dim=1)
        if self.packed is None:
            return StackedWeights(tuple(layout), lora_a.T.contiguous(), lora_b.T.contiguous())
        compute = self.packed.compute_dtype
        pack = torch.ops.mkldnn._reorder_linear_weight
        return StackedWeights(tuple(layout), pack(lora_a.to(compute)), pack(lora_b.to(compute)))
