"""Rotary position embedding in HF Llama's "rotate half" layout.

`LlamaForCausalLM.forward` looks up the cos/sin rows of the step's positions once
(`RotaryEmbedding.lookup`) and every layer applies them to its queries and keys together
(`apply_rotary`). The tables are float32, computed exactly as transformers does, and cast to
the model's dtype per step, as transformers does.
"""

from dataclasses import dataclass

import torch


@dataclass
class RotaryTables:
    # (num_tokens, 1, head_dim) cos of each token's angles, both halves.
    cos: torch.Tensor
    # (num_tokens, 1, head_dim) sin with the first half negated, so that rotating is
    # x * cos + swap_halves(x) * signed_sin.
    signed_sin: torch.Tensor


class RotaryEmbedding:
    """The cos/sin tables of every position below `max_positions`, float32."""

    def __init__(self, head_dim: int, max_positions: int, theta: float):
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
        inverse_frequencies = 1.0 / (theta ** exponents)
        positions = torch.arange(max_positions, dtype=torch.int64, device="cpu").float()
        angles = torch.outer(positions, inverse_frequencies)
        sin = angles.sin()
        # Not module buffers: the tables stay float32 whatever dtype the model is cast to.
        self.cos_table = torch.cat((angles.cos(), angles.cos()), dim=-1)
        self.signed_sin_table = torch.cat((-sin, sin), dim=-1)

    def to(self, device: torch.device | str) -> "RotaryEmbedding":
        """Move the tables (the model's device; they stay float32)."""
        self.cos_table = self.cos_table.to(device)
        self.signed_sin_table = self.signed_sin_table.to(device)
        return self

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> RotaryTables:
        cos = self.cos_table.index_select(0, positions).to(dtype)
        signed_sin = self.signed_sin_table.index_select(0, positions).to(dtype)
        return RotaryTables(cos.unsqueeze(1), signed_sin.unsqueeze(1))


def apply_rotary(x: torch.Tensor, tables: RotaryTables) -> torch.Tensor:
    """(num_tokens, num_heads, head_dim) -> rotated copy (contiguous); rounds as transformers
    does: x * cos and rotate_half(x) * sin each in x's dtype, then their sum."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
    return x * tables.cos + swapped * tables.signed_sin
