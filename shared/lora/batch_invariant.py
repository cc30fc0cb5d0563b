"""LoRA deltas for deterministic mode: a row's delta the same bits however the step is batched.

`LoRALinear` multiplies each adapter's whole row segment at once in the model's dtype, so a
row's delta depends on how many rows share its adapter in the step (the matmul kernel, and
with it the reduction order, follows the row count). `RowTiledLoRALinear` instead computes
every delta in float32 on zero-padded tiles of exactly `ROW_TILE` rows with the adapter's
weights zero-padded to `max_lora_rank`: every call has one shape per sub-module, whatever the
batch, so a row's delta cannot depend on its neighbours (zero rows and zero rank columns add
nothing). The delta is added to the base output in float32 and rounded once. `probe_deltas`
checks that on this CPU at load time, as `make_batch_invariant` does for the base layers.
"""

import torch
import torch.nn.functional as F

from shared.lora.layers import LoRALinear, module_dims
from shared.model.config import ModelConfig
from shared.model.batch_invariance import PROBE_ROW_COUNTS, ROW_TILE, is_row_invariant


def tiled_delta(rows: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, tile: int = ROW_TILE) -> torch.Tensor:
    """`(rows A^T) B^T` in float32, computed on zero-padded tiles of exactly `tile` rows."""
    num_rows = rows.shape[0]
    padded = F.pad(rows.float(), (0, 0, 0, -num_rows % tile))
    return torch.cat([(part @ lora_a.T) @ lora_b.T for part in padded.split(tile)])[:num_rows]


class RowTiledLoRALinear(LoRALinear):
    """A LoRALinear whose deltas are batch-invariant (see the module doc)."""

    # make_batch_invariant must not run a module holding this one on row tiles: its row
    # segments index the whole step's rows.
    row_segmented = True

    def __init__(self, *args, pad_rank: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.pad_rank = pad_rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        for first, end, slot in self.step.segments:
            rows = x[first:end]
            for weights, (start, stop) in zip(self.slots[slot], self.columns):
                if weights is not None:
                    delta = tiled_delta(rows, *weights)
                    out[first:end, start:stop] = (out[first:end, start:stop].float() + delta).to(out.dtype)
        return out

    def set_slot(self, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store the weights in float32, zero-padded to `pad_rank` (one matmul shape per sub-module)."""
        padded = {}
        for module, (lora_a, lora_b) in weights.items():
            extra = self.pad_rank - lora_a.shape[0]
            padded[module] = (F.pad(lora_a.float(), (0, 0, 0, extra)), F.pad(lora_b.float(), (0, extra)))
        super().set_slot(slot, padded)


def probe_deltas(config: ModelConfig, max_rank: int, device: torch.device) -> None:
    """Raise RuntimeError unless every adaptable module shape's tiled delta is batch-invariant here."""
    generator = torch.Generator().manual_seed(0)
    shapes = set(module_dims(config).values())
    for in_features, out_features in sorted(shapes):
        lora_a = torch.randn(max_rank, in_features, generator=generator).to(device)
        lora_b = torch.randn(out_features, max_rank, generator=generator).to(device)
        if not is_row_invariant(lambda x: tiled_delta(x, lora_a, lora_b), in_features, torch.float32, device,
                                PROBE_ROW_COUNTS):
            raise RuntimeError(f"deterministic mode: the LoRA delta ({in_features} -> rank {max_rank} -> "
                               f"{out_features}) gives batch-dependent results even on fixed {ROW_TILE}-row "
                               f"tiles on this CPU")
