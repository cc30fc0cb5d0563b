"""The Triton LoRA kernels (the GPU path) against a float64 reference, and the LoRA layer's
Triton path against its torch path (under TRITON_INTERPRET=1 off a GPU)."""

from tests.unit.triton_setup import DEVICE, KERNEL_DTYPES, TOLERANCE  # noqa: I001  (skips without triton)

import pytest
import torch
from torch import nn

from shared.lora.layers import LoRALinear, StepAdapters
from shared.lora.triton_lora import add_lora_deltas, segment_tensors

IN_FEATURES, OUT_FEATURES, MAX_RANK, NUM_SLOTS = 48, 40, 16, 3
RANKS = (4, 8, 16)  # per slot; the stacked weights are zero beyond each rank
# Rows 5-8 and 30-31 belong to no segment (base-model rows); slot 1 appears twice.
SEGMENTS = [(0, 5, 1), (9, 30, 0), (32, 37, 2), (37, 40, 1)]
NUM_ROWS = 40


def stacked_weights(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    lora_a = torch.zeros(NUM_SLOTS, MAX_RANK, IN_FEATURES)
    lora_b = torch.zeros(NUM_SLOTS, OUT_FEATURES, MAX_RANK)
    for slot, rank in enumerate(RANKS):
        lora_a[slot, :rank] = torch.randn(rank, IN_FEATURES, generator=generator) / 4
        lora_b[slot, :, :rank] = torch.randn(OUT_FEATURES, rank, generator=generator) / 4
    return lora_a, lora_b


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_shrink_and_expand_match_float64(dtype):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(NUM_ROWS, IN_FEATURES, generator=generator).to(dtype)
    out = torch.randn(NUM_ROWS, OUT_FEATURES + 8, generator=generator).to(dtype)  # adds to columns 8..47
    lora_a, lora_b = (weights.to(dtype) for weights in stacked_weights(generator))
    expected = out.double()
    for first, end, slot in SEGMENTS:
        expected[first:end, 8:] += x[first:end].double() @ lora_a[slot].double().T @ lora_b[slot].double().T
    on_device = out.to(DEVICE)
    longest = max(end - first for first, end, _ in SEGMENTS)
    add_lora_deltas(on_device, x.to(DEVICE), lora_a.to(DEVICE), lora_b.to(DEVICE),
                    segment_tensors(SEGMENTS, DEVICE), longest, column_start=8)
    result = on_device.cpu()
    assert result.dtype == dtype
    torch.testing.assert_close(result.double(), expected, rtol=0, atol=40 * TOLERANCE[dtype])
    untouched = [row for row in range(NUM_ROWS) if not any(first <= row < end for first, end, _ in SEGMENTS)]
    assert torch.equal(result[untouched], out[untouched])
    assert torch.equal(result[:, :8], out[:, :8])


def make_layer(step: StepAdapters, max_rank: int, base: nn.Linear) -> LoRALinear:
    return LoRALinear(base, 0, ("q_proj", "k_proj", "v_proj"), [16, 8, 16], step, NUM_SLOTS, max_rank)


def test_the_layer_runs_the_same_on_the_triton_path_as_on_the_torch_path():
    generator = torch.Generator().manual_seed(1)
    base = nn.Linear(IN_FEATURES, 40, bias=False)
    torch_step, triton_step = StepAdapters(), StepAdapters()
    on_torch, on_triton = make_layer(torch_step, 0, base), make_layer(triton_step, MAX_RANK, base)
    for slot, rank in enumerate(RANKS):
        weights = {module: (torch.randn(rank, IN_FEATURES, generator=generator) / 4,
                            torch.randn(size, rank, generator=generator) / 4)
                   for module, size in (("q_proj", 16), ("v_proj", 16)) if slot != 2 or module == "v_proj"}
        for layer in (on_torch, on_triton):
            layer.set_slot(slot, weights)
    for step in (torch_step, triton_step):
        step.set(SEGMENTS)
    x = torch.randn(NUM_ROWS, IN_FEATURES, generator=generator)
    with torch.inference_mode():
        expected, result = on_torch(x), on_triton(x)
    torch.testing.assert_close(result, expected, rtol=0, atol=1e-5)
    assert not torch.equal(expected, base(x))  # the adapters changed something
