"""The interface between the model and a paged-attention implementation.

The model (shared/model/llama.py) calls `prepare` once per forward pass, turning the step's
`AttentionMetadata` into whatever the implementation wants to reuse in every layer (index
tensors, masks), then `forward` once per layer. `TorchPagedAttention` (torch_paged.py) is the
CPU implementation; a GPU kernel backend implements the same two methods.
"""

from abc import ABC, abstractmethod
from typing import Any

import torch

from shared.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    """Attention over a paged KV cache for a flat batch of decodes and prefill chunks."""

    # True when the model should also run its RMSNorms (fused with the residual add) and rotary
    # embedding with the Triton kernels (shared/attention/triton_kernels), as on CUDA.
    fused_layer_ops = False
    # True when the backend computes on the CPU (the model then runs its norms and rotary
    # embedding with the C++ layer ops, shared/model/cpu_layer_ops.py).
    runs_on_cpu = False

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5

    def describe(self, block_size: int, dtype: torch.dtype) -> tuple[str, str]:
        """(decode attention, prompt attention): what runs them, in words (compute_paths.py)."""
        return type(self).__name__, type(self).__name__

    @abstractmethod
    def prepare(self, metadata: AttentionMetadata, block_size: int, dtype: torch.dtype) -> Any:
        """Per-step state shared by every layer of one forward pass."""

    @abstractmethod
    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_cache: torch.Tensor, value_cache: torch.Tensor, step: Any) -> torch.Tensor:
        """One layer: store `key`/`value` (T, num_kv_heads, head_dim) at the step's slots of
        `key_cache`/`value_cache` (num_blocks, block_size, num_kv_heads, head_dim), then attend
        with `query` (T, num_heads, head_dim) over each sequence's cached context.
        Returns (T, num_heads, head_dim)."""
