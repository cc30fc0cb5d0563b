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
Prefill chunks run one sequence at a time (a step has few) through torch's fused CPU attention
(`F.scaled_dot_product_attention`'s flash kernel), plainly causal for a chunk that starts its
sequence and with an offset causal mask after cached tokens: on an AMX Xeon (1 thread, bf16,
SmolLM2's heads) 3.6 ms a layer for a 512-token prompt against 10.9 ms for the two batched
matmuls it replaced.

`deterministic=True` (batch-invariant mode, docs/deterministic.md) sends every row, decode
or prompt, through the C++ kernel, each over the context up to its own position (a prompt
chunk's rows as one segment, whose context tiles the kernel reads once for all of them):
one fixed tiling of the keys (16-token tiles in block order, online softmax in fp32) per row
whatever the batch, the chunking or the prefix-cache hits, so a token's attention output is
the same bits however it was scheduled. It runs on the kernel's AVX-512F path where the CPU has
it, else the portable one: the paths whose invariance the tests prove on every CPU, never the
bf16 or AMX paths of newer CPUs (PDSERVE_CPU_ATTENTION_PATH may choose between the two).
"""

import torch
import torch.nn.functional as F

from shared.attention.backend import AttentionBackend
from shared.attention.metadata import AttentionMetadata
from shared.attention.native_decode import PATH_ENV_VAR, NativePagedDecode, load_native_decode, requested_path
from shared.attention.torch_paged_step import (
    DecodeGroup, NativeDecodeInputs, PrefillChunk, TorchPagedStep, additive_mask, offset_causal_mask,
    segment_native_inputs, plan_decode_groups, plan_prefill_chunks)
from shared.errors import ConfigurationError
from shared.native.cpu_matmul import cpu_matmul_dtype

# Above this many KV heads the flat kernel's masked-out work outgrows its savings.
FLAT_DECODE_MAX_KV_HEADS = 4
# The kernel paths deterministic mode may take, preferred first (see the module docstring).
DETERMINISTIC_PATHS = ("avx512f", "portable")


class TorchPagedAttention(AttentionBackend):
    """CPU paged attention. `decode_kernel` is "auto", "native" or "torch" (see the module
    docstring); `flat_decode` picks the torch decode path (None: by KV head count);
    `deterministic` runs every row through the C++ kernel (batch-invariant, see above)."""

    runs_on_cpu = True

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
        self._kernel_paths: dict[tuple[int, torch.dtype], str] = {}

    def uses_native_decode(self, block_size: int, dtype: torch.dtype) -> bool:
        if self.native_decode is None:
            return False
        supported = self.native_decode.supports(self.num_heads, self.num_kv_heads, self.head_dim, block_size, dtype)
        if not supported and self.decode_kernel == "native":
            raise ValueError(f"decode_kernel: the native kernel does not support heads={self.num_heads}, "
                             f"kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                             f"block_size={block_size}, dtype={dtype}")
        return supported

    def kernel_path(self, block_size: int, dtype: torch.dtype) -> str:
        """The C++ kernel's path for this model's rows (native_decode.py), chosen once."""
        key = (block_size, dtype)
        if key not in self._kernel_paths:
            shapes = (self.num_heads, self.num_kv_heads, self.head_dim, block_size, dtype)
            if self.deterministic:
                self._kernel_paths[key] = _deterministic_path(self.native_decode.available_paths(*shapes))
            else:
                self._kernel_paths[key] = self.native_decode.path(*shapes)
        return self._kernel_paths[key]

    def describe(self, block_size: int, dtype: torch.dtype) -> tuple[str, str]:
        if self.uses_native_decode(block_size, dtype):
            decode = f"C++ kernel, {self.kernel_path(block_size, dtype)} path"
        else:
            decode = f"torch matmuls ({'flat' if self.flat_decode else 'grouped'})"
        if self.deterministic and self.uses_native_decode(block_size, dtype):
            return decode, f"{decode} (deterministic)"
        prompt_dtype = str(cpu_matmul_dtype(dtype)).removeprefix("torch.")
        return decode, f"torch SDPA (flash), {prompt_dtype}"

    def prepare(self, metadata: AttentionMetadata, block_size: int, dtype: torch.dtype) -> TorchPagedStep:
        if self.deterministic and self.uses_native_decode(block_size, dtype):
            inputs = segment_native_inputs(metadata, block_size)
            return TorchPagedStep(metadata.slot_mapping, int(inputs.query_lens.sum()), [], [], inputs)
        chunks = plan_prefill_chunks(metadata, block_size)
        prompt_dtype = cpu_matmul_dtype(dtype)  # fp32 for bf16 on a CPU without bf16 hardware
        for chunk in chunks:
            chunk.compute_dtype = prompt_dtype
            if chunk.context_len > chunk.query_len:  # after cached tokens: the offset causal mask
                chunk.score_bias = additive_mask(offset_causal_mask(chunk.query_len, chunk.context_len), prompt_dtype)
        if metadata.num_decode_tokens and self.uses_native_decode(block_size, dtype):
            native_inputs = NativeDecodeInputs.from_metadata(metadata)
            return TorchPagedStep(metadata.slot_mapping, metadata.num_decode_tokens, [], chunks, native_inputs)
        groups = plan_decode_groups(metadata, block_size)
        for group in groups:
            group.score_bias = self._decode_score_bias(group.is_in_context, dtype)
        return TorchPagedStep(metadata.slot_mapping, metadata.num_decode_tokens, groups, chunks)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_cache: torch.Tensor, value_cache: torch.Tensor, step: TorchPagedStep) -> torch.Tensor:
        _store(key, value, key_cache, value_cache, step, self.native_decode)
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
            path = self.kernel_path(key_cache.shape[1], query.dtype)
            return self.native_decode(query, key_cache, value_cache, inputs.block_tables, inputs.context_lens,
                                      self.scale, inputs.query_lens, path=path)
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

        torch's fused CPU attention (flash attention: tiled, online softmax, oneDNN matmuls on
        bf16 hardware), its query heads sharing their KV head's keys without copies. A chunk
        that starts the sequence is plainly causal, so the kernel skips the masked half; a chunk
        after cached tokens takes the offset causal mask (chunk.score_bias)."""
        compute = chunk.compute_dtype  # the dtype prompt attention computes in (`prepare`)
        keys = key_cache.index_select(0, chunk.block_ids).flatten(0, 1)[:chunk.context_len]
        values = value_cache.index_select(0, chunk.block_ids).flatten(0, 1)[:chunk.context_len]
        queries = query.transpose(0, 1).unsqueeze(0).to(compute)
        keys = keys.transpose(0, 1).unsqueeze(0).to(compute)
        values = values.transpose(0, 1).unsqueeze(0).to(compute)
        output = F.scaled_dot_product_attention(queries, keys, values, attn_mask=chunk.score_bias,
                                                is_causal=chunk.score_bias is None, scale=self.scale,
                                                enable_gqa=True)
        return output[0].transpose(0, 1).to(query.dtype)

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


def _deterministic_path(available: list[str]) -> str:
    forced = requested_path()
    if forced is None:
        return next(path for path in DETERMINISTIC_PATHS if path in available)
    if forced not in DETERMINISTIC_PATHS or forced not in available:
        raise ConfigurationError(PATH_ENV_VAR, f"deterministic mode runs on the {' or '.join(DETERMINISTIC_PATHS)} "
                                               f"path (this machine has {', '.join(available)}), not {forced}")
    return forced


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
           step: TorchPagedStep, kernel: NativePagedDecode | None) -> None:
    """Write each new token's key/value at its slot (block_id * block_size + offset): in one
    C++ call when the kernel is there and the step's slots are known to be inside the caches,
    else with index_copy_ (which checks them itself)."""
    slot_mapping = step.slot_mapping
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    if (kernel is not None and step.slot_range is not None and 0 <= step.slot_range[0]
            and step.slot_range[1] < num_slots and kernel.store_kv(key, value, key_cache, value_cache, slot_mapping)):
        return
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slot_mapping, key)
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(0, slot_mapping, value)
