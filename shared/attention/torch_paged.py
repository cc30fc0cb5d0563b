"""Paged attention in plain torch, the CPU backend.

Every layer first stores the step's new keys/values at their cache slots, then reads each
sequence's whole context back THROUGH its block table: earlier prompt chunks and prefix-cache
hits exist only in the cache.

Decodes (one query row per sequence) run batched, with no Python loop over sequences: at most
a few groups of similar context length (torch_paged_step.py), each padded to its longest; a
group's blocks are gathered at once with `index_select` over whole blocks (each block is a
contiguous slab, so this is a memcpy per block), key positions past a sequence's context are
masked, and two batched matmuls do the rest. With few KV heads the "flat" kernel
treats a sequence's (position, kv_head) rows as one key matrix and masks the other heads'
columns: the wasted multiply-adds cost less than the copies a per-head layout would need.
When the C++ kernel (native_decode.py) builds on this machine and supports the shapes, decodes
skip all of that: it reads keys and values in place through the block tables (`decode_kernel`
"auto", the default; "torch" forces the path above, "native" requires the kernel).
Prefill chunks run one sequence at a time (a step has few) as two batched matmuls over the
heads, a third faster than torch's CPU flash-attention kernel on a 512-token prompt.

`deterministic=True` (batch-invariant mode, docs/deterministic.md) sends every row, decode
or prompt, through the C++ kernel, each over the context up to its own position (a prompt
chunk's rows as one segment, whose context tiles the kernel reads once for all of them):
one fixed tiling of the keys (16-token tiles in block order, online softmax in fp32) per row
whatever the batch, the chunking or the prefix-cache hits, so a token's attention output is
the same bits however it was scheduled.
"""

import torch
import torch.nn.functional as F

from shared.attention.backend import AttentionBackend
from shared.attention.metadata import AttentionMetadata
from shared.attention.native_decode import NativePagedDecode, load_native_decode
from shared.attention.torch_paged_step import (
    DecodeGroup, NativeDecodeInputs, PrefillChunk, TorchPagedStep, additive_mask, segment_native_inputs,
    plan_decode_groups, plan_prefill_chunks)
from shared.native.cpu_matmul import cpu_matmul_dtype

# Above this many KV heads the flat kernel's masked-out work outgrows its savings.
FLAT_DECODE_MAX_KV_HEADS = 4
# Bound on a prefill chunk's attention scores held at once (elements), ~8 MiB in bf16.
MAX_SCORES_PER_PIECE = 1 << 22
# Query rows per piece of a prefill chunk: smaller pieces skip more of the causally masked
# scores but cost more operations.
PREFILL_PIECE_ROWS = 128


class TorchPagedAttention(AttentionBackend):
    """CPU paged attention. `decode_kernel` is "auto", "native" or "torch" (see the module
    docstring); `flat_decode` picks the torch decode path (None: by KV head count);
    `deterministic` runs every row through the C++ kernel (batch-invariant, see above)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, flat_decode: bool | None = None,
                 decode_kernel: str = "auto", deterministic: bool = False):
        super().__init__(num_heads, num_kv_heads, head_dim)
        self.num_queries_per_kv = num_heads // num_kv_heads
        self.flat_decode = num_kv_heads <= FLAT_DECODE_MAX_KV_HEADS if flat_decode is None else flat_decode
        self.deterministic = deterministic
        if deterministic and decode_kernel == "torch":
            raise ValueError("decode_kernel: deterministic mode needs the native kernel, not torch")
        self.decode_kernel = "native" if deterministic else decode_kernel
        self.native_decode = _native_decode_for(self.decode_kernel)

    def uses_native_decode(self, block_size: int, dtype: torch.dtype) -> bool:
        if self.native_decode is None:
            return False
        supported = self.native_decode.supports(self.num_heads, self.num_kv_heads, self.head_dim, block_size, dtype)
        if not supported and self.decode_kernel == "native":
            raise ValueError(f"decode_kernel: the native kernel does not support heads={self.num_heads}, "
                             f"kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                             f"block_size={block_size}, dtype={dtype}")
        return supported

    def prepare(self, metadata: AttentionMetadata, block_size: int, dtype: torch.dtype) -> TorchPagedStep:
        if self.deterministic and self.uses_native_decode(block_size, dtype):
            inputs = segment_native_inputs(metadata, block_size)
            return TorchPagedStep(metadata.slot_mapping, int(inputs.query_lens.sum()), [], [], inputs)
        chunks = plan_prefill_chunks(metadata, block_size)
        prompt_dtype = cpu_matmul_dtype(dtype)  # fp32 for bf16 on a CPU without bf16 hardware
        for chunk in chunks:
            chunk.score_bias = additive_mask(chunk.causal_mask, prompt_dtype)
        if metadata.num_decode_tokens and self.uses_native_decode(block_size, dtype):
            native_inputs = NativeDecodeInputs.from_metadata(metadata)
            return TorchPagedStep(metadata.slot_mapping, metadata.num_decode_tokens, [], chunks, native_inputs)
        groups = plan_decode_groups(metadata, block_size)
        for group in groups:
            group.score_bias = self._decode_score_bias(group.is_in_context, dtype)
        return TorchPagedStep(metadata.slot_mapping, metadata.num_decode_tokens, groups, chunks)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_cache: torch.Tensor, value_cache: torch.Tensor, step: TorchPagedStep) -> torch.Tensor:
        _store(key, value, key_cache, value_cache, step.slot_mapping)
        num_decodes = step.num_decodes
        if not step.prefills:
            return self._decode(query, key_cache, value_cache, step)
        output = query.new_empty(query.shape)
        if num_decodes:
            output[:num_decodes] = self._decode(query[:num_decodes], key_cache, value_cache, step)
        for chunk in step.prefills:
            rows = slice(chunk.first_row, chunk.first_row + chunk.query_len)
            output[rows] = self._prefill(query[rows], key_cache, value_cache, chunk)
        return output

    def _decode(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                step: TorchPagedStep) -> torch.Tensor:
        """(num_decodes, num_heads, head_dim) queries, one per sequence -> outputs, same shape."""
        if step.native_decode is not None:
            inputs = step.native_decode
            return self.native_decode(query, key_cache, value_cache, inputs.block_tables, inputs.context_lens,
                                      self.scale, inputs.query_lens)
        groups = step.decode_groups
        if len(groups) == 1 and groups[0].rows is None:
            return self._decode_group(query, key_cache, value_cache, groups[0])
        output = query.new_empty(query.shape)
        for group in groups:
            attended = self._decode_group(query.index_select(0, group.rows), key_cache, value_cache, group)
            output.index_copy_(0, group.rows, attended)
        return output

    def _decode_group(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      group: DecodeGroup) -> torch.Tensor:
        num_seqs, padded_len = group.num_seqs, group.padded_len
        keys = key_cache.index_select(0, group.block_ids)
        values = value_cache.index_select(0, group.block_ids)
        if self.flat_decode:
            keys = keys.view(num_seqs, padded_len * self.num_kv_heads, self.head_dim)
            values = values.view(num_seqs, padded_len * self.num_kv_heads, self.head_dim)
            scores = torch.baddbmm(group.score_bias, query, keys.transpose(1, 2), alpha=self.scale)
            return torch.bmm(torch.softmax(scores, dim=-1), values)
        grouped_shape = (num_seqs, padded_len, self.num_kv_heads, self.head_dim)
        output = F.scaled_dot_product_attention(
            query.view(num_seqs, self.num_kv_heads, self.num_queries_per_kv, self.head_dim),
            keys.view(grouped_shape).transpose(1, 2), values.view(grouped_shape).transpose(1, 2),
            attn_mask=group.score_bias, scale=self.scale)
        return output.view(num_seqs, self.num_heads, self.head_dim)

    def _prefill(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 chunk: PrefillChunk) -> torch.Tensor:
        """(query_len, num_heads, head_dim) rows of one sequence -> outputs, same shape.

        Two batched matmuls over the heads, each KV head's keys and values copied for its query
        heads (cheap next to the scores). Query rows go a piece at a time, each piece against
        only the keys its last row may see, which skips most of the causally masked work and
        bounds the scores' memory."""
        compute = chunk.score_bias.dtype  # the dtype prompt attention computes in (`prepare`)
        keys = key_cache.index_select(0, chunk.block_ids).flatten(0, 1)[:chunk.context_len]
        values = value_cache.index_select(0, chunk.block_ids).flatten(0, 1)[:chunk.context_len]
        keys_t = keys.permute(1, 2, 0).repeat_interleave(self.num_queries_per_kv, dim=0).to(compute)
        values = values.transpose(0, 1).repeat_interleave(self.num_queries_per_kv, dim=0).to(compute)
        queries = query.transpose(0, 1).to(compute)
        output = queries.new_empty(queries.shape)
        num_cached = chunk.context_len - chunk.query_len
        piece = min(PREFILL_PIECE_ROWS, max(1, MAX_SCORES_PER_PIECE // (self.num_heads * chunk.context_len)))
        for start in range(0, chunk.query_len, piece):
            stop = min(start + piece, chunk.query_len)
            visible = num_cached + stop
            scores = torch.baddbmm(chunk.score_bias[start:stop, :visible], queries[:, start:stop],
                                   keys_t[:, :, :visible], alpha=self.scale)
            torch.bmm(torch.softmax(scores, dim=-1), values[:, :visible], out=output[:, start:stop])
        return output.transpose(0, 1).to(query.dtype)

    def _decode_score_bias(self, is_in_context: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Flat kernel: (n, num_heads, padded_len * num_kv_heads), allowing a column when its
        position is in context and its KV head is the one the query head reads.
        Grouped kernel: (n, 1, 1, padded_len)."""
        if not self.flat_decode:
            return additive_mask(is_in_context[:, None, None, :], dtype)
        kv_head_of_query = torch.arange(self.num_heads) // self.num_queries_per_kv
        is_own_kv_head = kv_head_of_query[:, None] == torch.arange(self.num_kv_heads)
        allowed = is_in_context[:, None, :, None] & is_own_kv_head[None, :, None, :]
        return additive_mask(allowed.flatten(2), dtype)


def _native_decode_for(decode_kernel: str) -> NativePagedDecode | None:
    if decode_kernel not in ("auto", "native", "torch"):
        raise ValueError(f"decode_kernel: expected auto, native or torch, got {decode_kernel!r}")
    if decode_kernel == "torch":
        return None
    kernel = load_native_decode()
    if kernel is None and decode_kernel == "native":
        raise RuntimeError("decode_kernel: the native kernel could not be built or is disabled")
    return kernel


def _store(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
           slot_mapping: torch.Tensor) -> None:
    """Write each new token's key/value at its slot (block_id * block_size + offset)."""
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slot_mapping, value)
