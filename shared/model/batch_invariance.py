"""Batch-invariant linear layers and norms for deterministic mode (`EngineConfig.deterministic`).

A row's result must not depend on how many other rows share its matmul or where it sits
among them. oneDNN's bf16 kernels on this project's CPUs keep each output element's reduction
order fixed for any row count of 2 or more (measured: every row count from 2 to 2,048, any
position, 1 or 2 threads), but take another kernel, with another order, for a single row;
`PackedLinear` already pads rows to a bucket of at least 8, so a lone decode never meets that
kernel. Other CPUs or library versions may choose kernels differently, so deterministic mode
does not assume it: `make_batch_invariant` probes one layer of every shape at load time (a row
alone against the same row among 2 to 2,048 others, first and last) and wraps a layer that
fails in `RowTiled`, which always calls the kernel on tiles of exactly `ROW_TILE` rows (one
shape, zero-padded); a shape that fails even so is an error, never a silent fallback.
RMSNorm normalizes each row on its own and is probed the same way. With LoRA the projections
inside each LoRA layer are probed one by one (never an MLP holding them: its tiles would
renumber the rows the adapters' segments name); shared.lora.batch_invariant makes the deltas
batch-invariant.
"""

import logging

import torch
import torch.nn.functional as F
from torch import nn

from shared.model.llama import LlamaMLP, RMSNorm
from shared.model.packed_linear import PackedGatedMLP, PackedLinear

logger = logging.getLogger(__name__)

ROW_TILE = 64
# Batch sizes a probe row is checked in (besides alone): small, around a tile, a full step.
PROBE_ROW_COUNTS = (2, 3, 8, 17, 64, 65, 300, 2048)
# The LM head only sees the rows whose logits are wanted (a row per sequence, or a prompt's
# rows for prompt logprobs): probing it at 2,048 rows would cost seconds.
LM_HEAD_PROBE_ROW_COUNTS = (2, 3, 8, 17, 64, 65, 300)
ROW_WISE_TYPES = (nn.Linear, PackedLinear, PackedGatedMLP, LlamaMLP)


class RowTiled(nn.Module):
    """A row-wise module run on zero-padded tiles of exactly `tile` rows, one call per tile."""

    def __init__(self, inner: nn.Module, tile: int = ROW_TILE):
        super().__init__()
        self.inner = inner
        self.tile = tile

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_rows = x.shape[0]
        padded = F.pad(x, (0, 0, 0, -num_rows % self.tile))
        return torch.cat([self.inner(tile) for tile in padded.split(self.tile)])[:num_rows]


def is_row_invariant(module: nn.Module, width: int, dtype: torch.dtype, device: torch.device,
                     row_counts: tuple[int, ...] = PROBE_ROW_COUNTS) -> bool:
    """True when a probe row's output is the same bits alone and first or last among others."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(max(row_counts), width, generator=generator).to(device=device, dtype=dtype)
    alone = module(rows[:1])[0]
    for count in row_counts:
        batch = rows[:count]
        if not torch.equal(module(batch)[0], alone):
            return False
        if not torch.equal(module(batch.roll(count - 1, dims=0))[count - 1], alone):
            return False
    return True


@torch.inference_mode()
def make_batch_invariant(model: nn.Module, max_rows: int = PROBE_ROW_COUNTS[-1]) -> int:
    """Probe each distinct row-wise layer shape of `model` (up to `max_rows` rows at once, a
    step's token budget); wrap the layers of shapes that fail in `RowTiled`. Returns how many
    layers were wrapped; raises RuntimeError when a layer is not batch-invariant even on fixed
    tiles, or an RMSNorm is not."""
    row_counts = tuple(sorted(set(PROBE_ROW_COUNTS) | {max_rows}))
    verdicts: dict[tuple, bool] = {}
    wrapped = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, RMSNorm):
            _check_norm(name, module, verdicts, row_counts)
        if not _is_row_wise(module) or _parent_is_row_wise(model, name):
            continue
        key = _shape_key(module)
        if key not in verdicts:
            verdicts[key] = _probe(module, name, row_counts)
        if not verdicts[key]:
            _wrap(model, name, module, key, row_counts)
            wrapped += 1
    logger.info("deterministic mode: %d layer shapes probed, %d layers on fixed %d-row tiles",
                len(verdicts), wrapped, ROW_TILE)
    return wrapped


def _probe(module: nn.Module, name: str, row_counts: tuple[int, ...], tile: int | None = None) -> bool:
    width, dtype, device = _input_spec(module)
    counts = LM_HEAD_PROBE_ROW_COUNTS if name.endswith("lm_head") else row_counts
    probed = module if tile is None else RowTiled(module, tile)
    return is_row_invariant(probed, width, dtype, device, counts)


def _wrap(model: nn.Module, name: str, module: nn.Module, key: tuple, row_counts: tuple[int, ...]) -> None:
    if not _probe(module, name, row_counts, ROW_TILE):
        raise RuntimeError(f"deterministic mode: layer {name} {key} gives batch-dependent results even on "
                           f"fixed {ROW_TILE}-row tiles on this CPU")
    parent_name, _, child_name = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child_name, RowTiled(module))


def _check_norm(name: str, norm: RMSNorm, verdicts: dict[tuple, bool], row_counts: tuple[int, ...]) -> None:
    key = ("RMSNorm", norm.weight.shape[0], norm.weight.dtype)
    if key not in verdicts:
        verdicts[key] = is_row_invariant(norm, norm.weight.shape[0], norm.weight.dtype, norm.weight.device,
                                         row_counts)
    if not verdicts[key]:
        raise RuntimeError(f"deterministic mode: RMSNorm {name} gives batch-dependent results on this CPU")


def _is_row_wise(module: nn.Module) -> bool:
    """A module probed (and tiled if need be) as one: a row-wise type holding no module that
    indexes the step's rows (LoRA layers, `row_segmented`), whose rows tiles would renumber."""
    return isinstance(module, ROW_WISE_TYPES) and not any(getattr(inner, "row_segmented", False)
                                                          for inner in module.modules())


def _parent_is_row_wise(model: nn.Module, name: str) -> bool:
    """Layers inside a probed row-wise module (PackedGatedMLP's down_proj) go with it."""
    parts = name.split(".")
    return any(_is_row_wise(model.get_submodule(".".join(parts[:i]))) for i in range(1, len(parts)))


def _shape_key(module: nn.Module) -> tuple:
    width, dtype, _ = _input_spec(module)
    outputs = sum(tensor.numel() for tensor in module.state_dict().values())
    return type(module).__name__, width, outputs, dtype


def _input_spec(module: nn.Module) -> tuple[int, torch.dtype, torch.device]:
    """(input features, dtype, device) of a row-wise module."""
    if isinstance(module, PackedGatedMLP):
        return module.down_proj.out_features, module.io_dtype, torch.device("cpu")
    if isinstance(module, PackedLinear):
        return module.in_features, module.io_dtype, torch.device("cpu")
    if isinstance(module, LlamaMLP):
        weight = module.gate_up_proj.weight
        return weight.shape[1], weight.dtype, weight.device
    return module.in_features, module.weight.dtype, module.weight.device
