"""LoRA on the model's linear layers, applied per row group, the base weights left untouched.

`LoRALinear` wraps one of the model's projections (an `nn.Linear` or a `PackedLinear`) whose
output may be several peft modules side by side (`qkv_proj` = q | k | v, `gate_up_proj` = gate |
up). Each step the model runner sets `StepAdapters.segments`: contiguous row ranges, each with
the adapter slot its rows use (rows of the base model are in no segment). For each segment and
each sub-module the adapter adapts, the layer adds `(x A^T) B^T` (B scaled) to those rows'
output columns: one pair of small matmuls per segment, never a merged weight, so requests for
different adapters and for the base share one step.
"""

from dataclasses import dataclass, field

import torch
from torch import nn

from shared.errors import ConfigurationError
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


class LoRALinear(nn.Module):
    """`base(x)` plus each segment's adapter delta on its rows and its sub-modules' columns."""

    def __init__(self, base: nn.Module, layer_index: int, modules: tuple[str, ...], out_sizes: list[int],
                 step: StepAdapters, num_slots: int):
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        for first, end, slot in self.step.segments:
            rows = x[first:end]
            for weights, (start, stop) in zip(self.slots[slot], self.columns):
                if weights is not None:
                    lora_a, lora_b = weights
                    out[first:end, start:stop] += (rows @ lora_a.T) @ lora_b.T
        return out

    def set_slot(self, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put an adapter's weights for this layer (by peft module name) into `slot`."""
        self.slots[slot] = [weights.get(module) for module in self.modules_in_output]


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


def attach_lora(model: nn.Module, step: StepAdapters, num_slots: int) -> list[LoRALinear]:
    """Wrap every projection of every decoder layer of `model` (a LlamaForCausalLM whose MLP is
    not fused into one module) in a LoRALinear; returns them."""
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
                lora = LoRALinear(base, layer_index, modules, [dims[module][1] for module in modules], step,
                                  num_slots)
                setattr(parent, name, lora)
                wrapped.append(lora)
    return wrapped
