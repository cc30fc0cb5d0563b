"""The LoRA layer's CPU path (shared.lora.cpu_deltas: every segment's delta in two matmuls over
the active slots' stacked weights) against a float64 loop over segments and sub-modules."""

import pytest
import torch
from torch import nn

from shared.lora.layers import LoRALinear, StepAdapters
from shared.model.packed_linear import PackedLinear, can_pack

IN_FEATURES, OUT_SIZES, NUM_SLOTS = 48, [16, 8, 16], 4
MODULES = ("q_proj", "k_proj", "v_proj")
# Per slot: the sub-modules it adapts and its rank. Slot 3 adapts none of this projection's.
SLOT_SPECS = {0: (("q_proj", "v_proj"), 4), 1: (("q_proj", "k_proj", "v_proj"), 8), 2: (("k_proj",), 16),
              3: ((), 8)}
# Rows 5-8 and 30-31 are base-model rows; slot 1 appears twice; slot 3's rows get no delta.
SEGMENTS = [(0, 5, 1), (9, 30, 0), (32, 37, 2), (37, 40, 1), (40, 44, 3)]
NUM_ROWS = 46


def random_weights(generator: torch.Generator) -> dict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    sizes = dict(zip(MODULES, OUT_SIZES))
    return {slot: {module: (torch.randn(rank, IN_FEATURES, generator=generator) / 4,
                            torch.randn(sizes[module], rank, generator=generator) / 4) for module in modules}
            for slot, (modules, rank) in SLOT_SPECS.items()}


def float64_reference(base: nn.Linear, x: torch.Tensor, weights, segments) -> torch.Tensor:
    out = x.double() @ base.weight.double().T
    starts = [sum(OUT_SIZES[:index]) for index in range(len(OUT_SIZES))]
    for first, end, slot in segments:
        for module, start, size in zip(MODULES, starts, OUT_SIZES):
            if module in weights[slot]:
                lora_a, lora_b = (tensor.double() for tensor in weights[slot][module])
                out[first:end, start:start + size] += (x[first:end].double() @ lora_a.T) @ lora_b.T
    return out


def layer_with_slots(base: nn.Module, step: StepAdapters, weights, dtype: torch.dtype) -> LoRALinear:
    layer = LoRALinear(base, 0, MODULES, OUT_SIZES, step, NUM_SLOTS)
    for slot, by_module in weights.items():
        layer.set_slot(slot, {module: (a.to(dtype), b.to(dtype)) for module, (a, b) in by_module.items()})
    return layer


def test_fp32_layer_matches_float64_loop_over_segments():
    generator = torch.Generator().manual_seed(3)
    base = nn.Linear(IN_FEATURES, sum(OUT_SIZES), bias=False)
    weights = random_weights(generator)
    step = StepAdapters()
    layer = layer_with_slots(base, step, weights, torch.float32)
    x = torch.randn(NUM_ROWS, IN_FEATURES, generator=generator)
    for segments in (SEGMENTS, [(0, 20, 2), (20, 46, 0)], []):  # the active slot set changes each step
        step.set(segments)
        with torch.inference_mode():
            result = layer(x)
        torch.testing.assert_close(result.double(), float64_reference(base, x, weights, segments), rtol=0, atol=1e-5)


def test_refilling_a_slot_uses_the_new_weights():
    generator = torch.Generator().manual_seed(4)
    base = nn.Linear(IN_FEATURES, sum(OUT_SIZES), bias=False)
    weights = random_weights(generator)
    step = StepAdapters()
    layer = layer_with_slots(base, step, weights, torch.float32)
    step.set(SEGMENTS)
    x = torch.randn(NUM_ROWS, IN_FEATURES, generator=generator)
    with torch.inference_mode():
        layer(x)  # stacks the weights of the active slots
        weights[0] = random_weights(generator)[1]
        layer.set_slot(0, weights[0])
        result = layer(x)
    torch.testing.assert_close(result.double(), float64_reference(base, x, weights, SEGMENTS), rtol=0, atol=1e-5)


@pytest.mark.skipif(not can_pack(torch.bfloat16), reason="oneDNN has no bf16 kernels on this CPU")
def test_packed_bf16_layer_matches_float64_and_leaves_base_rows_alone():
    generator = torch.Generator().manual_seed(5)
    linear = nn.Linear(IN_FEATURES, sum(OUT_SIZES), bias=False).to(torch.bfloat16)
    base = PackedLinear(linear)
    weights = random_weights(generator)
    step = StepAdapters()
    layer = layer_with_slots(base, step, weights, torch.bfloat16)
    step.set(SEGMENTS)
    x = torch.randn(NUM_ROWS, IN_FEATURES, generator=generator).to(torch.bfloat16)
    with torch.inference_mode():
        result, base_only = layer(x), base(x)
    reference = float64_reference(linear, x, weights, SEGMENTS)
    torch.testing.assert_close(result.double(), reference, rtol=2e-2, atol=2e-2)
    base_rows = [5, 6, 7, 8, 30, 31, 40, 41, 42, 43, 44, 45]  # no segment, or a slot adapting nothing here
    assert torch.equal(result[base_rows], base_only[base_rows])
    assert not torch.equal(result, base_only)
