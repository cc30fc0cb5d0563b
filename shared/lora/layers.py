"""LoRA on the model's linear layers, applied per row group, the base weights left untouched.

`LoRALinear` wraps one of the model's projections (an `nn.Linear` or a `PackedLinear`) whose
output may be several peft modules side by side (`qkv_proj` = q | k | v, `gate_up_proj` = gate |
up). Each step the model runner sets `StepAdapters.segments`: contiguous row ranges, each with
the adapter slot its rows use (rows of the base model are in no segment). For each segment and
each sub-module the adapter adapts, the layer adds `(x A^T) B^T` (B scaled) to those rows'
output columns, never a merged weight, so requests for different adapters and for the base
share one step. On the CPU all segments take two matmuls per projection over the active slots'
stacked weights (shared.lora.cpu_deltas); on a GPU, Triton kernels (shared.lora.triton_lora).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from shared.errors import ConfigurationError
from shared.lora.cpu_deltas import CpuDeltas, slot_piece
from shared.model.config import ModelConfig

# Our fused projections and the peft modules inside them, in output-column order.
FUSED_MODULES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}


@dataclass
class StepAdapters:
    """The current step's row segments: (first row, end row, slot), set by the model runner."""

    segments: list[tuple[int, int, int]] = field(default_factory=list)
    _on_device: tuple | None = None  # the segments as the Triton kernels take them, made once a step
    _active: tuple[int, ...] | None = None  # the slots the segments use, ascending
    _masks: dict = field(default_factory=dict)  # the CPU path's row masks, by (layout, rows, dtype, device)

    def set(self, segments: list[tuple[int, int, int]]) -> None:
        self.segments, self._on_device, self._active = segments, None, None
        self._masks.clear()

    def active_slots(self) -> tuple[int, ...]:
        if self._active is None:
            self._active = tuple(sorted({slot for _, _, slot in self.segments}))
        return self._active

    def row_mask(self, layout: tuple[tuple[int, int, int], ...], num_rows: int, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        """(num_rows x K) ones where a row's slot owns the column in `layout` ((slot, first column,
        end column) of each slot), zeros elsewhere; rows past the segments (padding) are zero.
        Made once a step per layout (layers adapting the same sub-modules share it)."""
        key = (layout, num_rows, dtype, device)
        mask = self._masks.get(key)
        if mask is None:
            mask = torch.zeros(num_rows, layout[-1][2], dtype=dtype)
            columns = {slot: (first, end) for slot, first, end in layout}
            for first_row, end_row, slot in self.segments:
                if slot in columns:
                    mask[first_row:end_row, columns[slot][0]:columns[slot][1]] = 1
            mask = self._masks[key] = mask.to(device)
        return mask

    def for_kernels(self, device: torch.device) -> tuple[tuple[torch.Tensor, ...], int]:
        """(first rows, end rows, slots) int32 tensors on `device`, and the longest segment."""
        if self._on_device is None:
            from shared.lora.triton_lora import segment_tensors
            longest = max((end - first for first, end, _ in self.segments), default=0)
            self._on_device = (segment_tensors(self.segments, device), longest)
        return self._on_device


class LoRALinear(nn.Module):
    """`base(x)` plus each segment's adapter delta on its rows and its sub-modules' columns."""

    def __init__(self, base: nn.Module, layer_index: int, modules: tuple[str, ...], out_sizes: list[int],
                 step: StepAdapters, num_slots: int, max_rank: int = 0):
        """`max_rank` > 0: the deltas run as Triton kernels (the GPU path, shared.lora.triton_lora)
        over per-sub-module weights stacked by slot and zero-padded to that rank."""
        super().__init__()
        self.base = base
        self.layer_index = layer_index
        self.modules_in_output = modules
        starts = [sum(out_sizes[:index]) for index in range(len(out_sizes))]
        self.columns = [(start, start + size) for start, size in zip(starts, out_sizes)]
        self.step = step
        # Per slot, per sub-module: (A: rank x in, scaled B: out x rank) or None (not adapted).
        self.slots: list[list[tuple[torch.Tensor, torch.Tensor] | None]] = [[None] * len(modules)
                                                                             for _ in range(num_slots)]
        self.max_rank = max_rank
        # Triton path: per sub-module (A: slots x max_rank x in, B: slots x out x max_rank), made
        # on first use; None where no slot's adapter adapts the sub-module.
        self.stacked: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(modules)
        self.cpu = None if max_rank else CpuDeltas(base, num_slots)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu is not None:
            return self.cpu.forward(self.base, x, self.step)
        return self._forward_triton(x)

    def _forward_triton(self, x: torch.Tensor) -> torch.Tensor:
        from shared.lora.triton_lora import add_lora_deltas
        out = self.base(x)
        if not self.step.segments:
            return out
        segments, longest = self.step.for_kernels(x.device)
        x = x.contiguous()
        for stacked, (start, _) in zip(self.stacked, self.columns):
            if stacked is not None:
                add_lora_deltas(out, x, stacked[0], stacked[1], segments, longest, start)
        return out

    def set_slot(self, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put an adapter's weights for this layer (by peft module name) into `slot`."""
        self.slots[slot] = [weights.get(module) for module in self.modules_in_output]
        if self.cpu is not None:
            self.cpu.set_piece(slot, slot_piece(self.slots[slot], self.columns))
        else:
            self._stack_slot(slot)

    def _stack_slot(self, slot: int) -> None:
        for index, weights in enumerate(self.slots[slot]):
            if weights is None and self.stacked[index] is None:
                continue
            if self.stacked[index] is None:
                lora_a, lora_b = weights
                start, stop = self.columns[index]
                num_slots = len(self.slots)
                self.stacked[index] = (lora_a.new_zeros(num_slots, self.max_rank, lora_a.shape[1]),
                                       lora_b.new_zeros(num_slots, stop - start, self.max_rank))
            stacked_a, stacked_b = self.stacked[index]
            stacked_a[slot].zero_()
            stacked_b[slot].zero_()
            if weights is not None:
                rank = weights[0].shape[0]
                stacked_a[slot, :rank].copy_(weights[0])
                stacked_b[slot, :, :rank].copy_(weights[1])


def module_dims(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in features, out features) of every peft module of a Llama layer."""
    attention_out = config.num_heads * config.head_dim
    kv_out = config.num_kv_heads * config.head_dim
    return {
        "q_proj": (config.hidden_size, attention_out), "k_proj": (config.hidden_size, kv_out),
        "v_proj": (config.hidden_size, kv_out), "o_proj": (attention_out, config.hidden_size),
        "gate_proj": (config.hidden_size, config.intermediate_size),
        "up_proj": (config.hidden_size, config.intermediate_size),
        "down_proj": (config.intermediate_size, config.hidden_size),
    }


def attach_lora(model: nn.Module, step: StepAdapters, num_slots: int, triton_max_rank: int = 0,
                layer_class: Callable[..., LoRALinear] = LoRALinear) -> list[LoRALinear]:
    """Wrap every projection of every decoder layer of `model` (a LlamaForCausalLM whose MLP is
    not fused into one module) in a `layer_class` (a LoRALinear); returns them.
    `triton_max_rank` > 0: the Triton path (GPU), weights padded to that rank."""
    dims = module_dims(model.config)
    wrapped = []
    for layer_index, layer in enumerate(model.layers):
        if not hasattr(layer.mlp, "gate_up_proj"):
            raise ConfigurationError("enable_lora", "the model's MLP is fused into one module; load it "
                                                    "with fuse_mlp=False to serve LoRA adapters")
        for parent in (layer.self_attn, layer.mlp):
            for name, modules in FUSED_MODULES.items():
                base = getattr(parent, name, None)
                if base is None:
                    continue
                lora = layer_class(base, layer_index, modules, [dims[module][1] for module in modules], step,
                                  num_slots, triton_max_rank)
                setattr(parent, name, lora)
                wrapped.append(lora)
    return wrapped
