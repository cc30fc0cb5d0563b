"""Paged attention with Triton kernels, the CUDA backend (same interface as TorchPagedAttention).

`prepare` moves the step's slot mapping, block tables and lengths to the device once per
forward pass; every layer then stores its new keys/values by slot (`store_kv`) and runs the
decode rows through flash-decoding (`decode_attention`) and the prefill chunks through one
varlen launch (`prefill_attention`). Off a GPU the kernels run under Triton's interpreter
(tests only).
"""

from dataclasses import dataclass

import torch

from shared.attention.backend import AttentionBackend
from shared.attention.metadata import AttentionMetadata
from shared.attention.triton_kernels.cache_write import store_kv
from shared.attention.triton_kernels.decode_attention import choose_num_splits, decode_attention
from shared.attention.triton_kernels.prefill_attention import prefill_attention


@dataclass
class TritonPagedStep:
    slot_mapping: torch.Tensor
    num_decodes: int
    decode_block_tables: torch.Tensor
    decode_context_lens: torch.Tensor
    num_splits: int
    prefill_block_tables: torch.Tensor
    prefill_cu_seqlens: torch.Tensor
    prefill_context_lens: torch.Tensor
    max_prefill_query_len: int


class TritonPagedAttention(AttentionBackend):
    fused_layer_ops = True

    def describe(self, block_size: int, dtype: torch.dtype) -> tuple[str, str]:
        return "Triton flash-decoding", "Triton prefill/extend"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, device: torch.device | str = "cuda",
                 num_splits: int | None = None):
        super().__init__(num_heads, num_kv_heads, head_dim)
        self.device = torch.device(device)
        # None: chosen per step from the batch size and the longest context.
        self.num_splits = num_splits

    def prepare(self, metadata: AttentionMetadata, block_size: int, dtype: torch.dtype) -> TritonPagedStep:
        to_device = self._to_device
        decode_lens = metadata.decode_context_lens
        num_decodes = metadata.num_decode_tokens
        num_splits = self.num_splits or choose_num_splits(
            num_decodes, self.num_kv_heads, int(decode_lens.max()) if num_decodes else 1)
        query_lens = torch.tensor(metadata.prefill_query_lens, dtype=torch.int32)
        cu_seqlens = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
        torch.cumsum(query_lens, 0, out=cu_seqlens[1:])
        return TritonPagedStep(
            slot_mapping=to_device(metadata.slot_mapping, torch.int64),
            num_decodes=num_decodes,
            decode_block_tables=to_device(metadata.decode_block_tables),
            decode_context_lens=to_device(decode_lens),
            num_splits=num_splits,
            prefill_block_tables=to_device(_padded(metadata.prefill_block_tables)),
            prefill_cu_seqlens=to_device(cu_seqlens),
            prefill_context_lens=to_device(torch.tensor(metadata.prefill_context_lens, dtype=torch.int32)),
            max_prefill_query_len=max(metadata.prefill_query_lens, default=0))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_cache: torch.Tensor, value_cache: torch.Tensor, step: TritonPagedStep) -> torch.Tensor:
        store_kv(key, value, key_cache, value_cache, step.slot_mapping)
        query = query if query.stride(-1) == 1 else query.contiguous()
        output = torch.empty_like(query)
        decodes = slice(0, step.num_decodes)
        if step.num_decodes:
            decode_attention(query[decodes], key_cache, value_cache, step.decode_block_tables,
                             step.decode_context_lens, self.scale, step.num_splits, output=output[decodes])
        if step.max_prefill_query_len:
            prefills = slice(step.num_decodes, query.shape[0])
            prefill_attention(query[prefills], key_cache, value_cache, step.prefill_block_tables,
                              step.prefill_cu_seqlens, step.prefill_context_lens, step.max_prefill_query_len,
                              self.scale, output=output[prefills])
        return output

    def _to_device(self, tensor: torch.Tensor, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return tensor.to(device=self.device, dtype=dtype)


def _padded(tables: list[torch.Tensor]) -> torch.Tensor:
    """The tables as one (n, longest) int32 matrix, right-padded with block 0."""
    width = max((len(table) for table in tables), default=0)
    matrix = torch.zeros((len(tables), max(width, 1)), dtype=torch.int32)
    for index, table in enumerate(tables):
        matrix[index, :len(table)] = table
    return matrix
