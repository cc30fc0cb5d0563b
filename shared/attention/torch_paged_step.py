"""What `TorchPagedAttention.prepare` derives from a step's AttentionMetadata, once for all layers.

Decodes are sorted by context length and split into a few groups when that saves more padded
key positions than the extra operations cost; each group is gathered and masked as one batch.
Each prefill chunk gets the blocks covering its context and a causal mask, offset by the
number of the sequence's tokens cached before the chunk.
"""

from dataclasses import dataclass, field

import torch

from shared.attention.metadata import AttentionMetadata
from shared.kv_cache.blocks import blocks_for_tokens

MAX_DECODE_GROUPS = 4
# What one more decode group costs (a handful of extra operations per layer), in key positions
# of gather-and-multiply work it must save to pay off; measured on SmolLM2-135M shapes.
GROUP_OVERHEAD_KEY_POSITIONS = 512


@dataclass
class DecodeGroup:
    """Decodes of similar context length, padded to the longest of them."""
    # (n,) the group's decode rows; None when the group is every decode, in row order.
    rows: torch.Tensor | None
    # (n * num_blocks,) the group's block tables, right-padded and flattened.
    block_ids: torch.Tensor
    # Key positions per sequence after padding: num_blocks * block_size.
    padded_len: int
    # (n, padded_len) True where the key position is inside the sequence's context.
    is_in_context: torch.Tensor
    # Additive 0 / -inf mask whose layout the decode kernel chooses (see TorchPagedAttention).
    score_bias: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return self.is_in_context.shape[0]


@dataclass
class PrefillChunk:
    first_row: int
    query_len: int
    context_len: int
    # (ceil(context_len / block_size),) the blocks holding the context.
    block_ids: torch.Tensor
    # Set by the backend: the dtype prompt attention computes in, and for a chunk after cached
    # tokens the additive 0 / -inf (query_len, context_len) mask letting row i see positions up
    # to its own (None for a chunk that starts its sequence: plainly causal).
    compute_dtype: torch.dtype | None = None
    score_bias: torch.Tensor | None = None


@dataclass
class NativeDecodeInputs:
    """The rows' segments as the C++ kernel reads them (native_decode.py): per segment, one
    sequence's consecutive rows, its block table and the context of its last row."""
    # (num_segments, max_blocks) int32, contiguous.
    block_tables: torch.Tensor
    # (num_segments,) int32.
    context_lens: torch.Tensor
    # (num_segments,) int32 rows per segment; None when every segment is one decode row.
    query_lens: torch.Tensor | None = None

    @classmethod
    def from_metadata(cls, metadata: AttentionMetadata) -> "NativeDecodeInputs":
        return cls(metadata.decode_block_tables.to(torch.int32).contiguous(),
                   metadata.decode_context_lens.to(torch.int32).contiguous())


@dataclass
class TorchPagedStep:
    slot_mapping: torch.Tensor
    num_decodes: int
    # Torch decode path: the decodes' groups. Empty when native_decode is set.
    decode_groups: list[DecodeGroup]
    prefills: list[PrefillChunk]
    native_decode: NativeDecodeInputs | None = None
    # (lowest, highest) slot of the step's tokens, found once for every layer's KV store;
    # None without tokens.
    slot_range: tuple[int, int] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.slot_mapping.numel():
            low, high = self.slot_mapping.aminmax()
            self.slot_range = (int(low), int(high))


def segment_native_inputs(metadata: AttentionMetadata, block_size: int) -> NativeDecodeInputs:
    """Every row of the step for the C++ kernel: each decode a segment of one row, each prefill
    chunk a segment of its rows (row i attends to the context up to its own position), so the
    kernel walks a chunk's context once for all its rows."""
    tables, context_lens, query_lens = [], [], []
    if metadata.num_decode_tokens:
        tables.append(metadata.decode_block_tables)
        context_lens.extend(metadata.decode_context_lens.tolist())
        query_lens.extend([1] * metadata.num_decode_tokens)
    for query_len, context_len, block_table in zip(
            metadata.prefill_query_lens, metadata.prefill_context_lens, metadata.prefill_block_tables):
        if not 0 < query_len <= context_len:
            raise ValueError(f"prefill_query_lens: a chunk of {query_len} rows in a context of {context_len}")
        tables.append(block_table[:blocks_for_tokens(context_len, block_size)][None, :])
        context_lens.append(context_len)
        query_lens.append(query_len)
    width = max(table.shape[1] for table in tables)
    block_tables = torch.zeros((len(context_lens), width), dtype=torch.int32)
    first_segment = 0
    for table in tables:
        block_tables[first_segment:first_segment + table.shape[0], :table.shape[1]] = table
        first_segment += table.shape[0]
    return NativeDecodeInputs(block_tables, torch.tensor(context_lens, dtype=torch.int32),
                              torch.tensor(query_lens, dtype=torch.int32))


def plan_decode_groups(metadata: AttentionMetadata, block_size: int) -> list[DecodeGroup]:
    if not metadata.num_decode_tokens:
        return []
    context_lens = metadata.decode_context_lens
    row_groups = split_by_length(context_lens.tolist(), block_size)
    if len(row_groups) == 1:
        return [_decode_group(None, metadata.decode_block_tables, context_lens, block_size)]
    groups = []
    for rows in row_groups:
        rows = torch.tensor(rows, dtype=torch.long)
        groups.append(_decode_group(rows, metadata.decode_block_tables[rows], context_lens[rows], block_size))
    return groups


def split_by_length(context_lens: list[int], block_size: int) -> list[list[int]]:
    """Row indices of the decodes in 1..MAX_DECODE_GROUPS equal-count groups of ascending
    context length, choosing the count with the least padded work plus per-group overhead."""
    num_seqs = len(context_lens)
    best_groups = [list(range(num_seqs))]
    best_cost = num_seqs * _round_up(max(context_lens), block_size)
    order = sorted(range(num_seqs), key=context_lens.__getitem__)
    for num_groups in range(2, min(MAX_DECODE_GROUPS, num_seqs) + 1):
        bounds = [round(i * num_seqs / num_groups) for i in range(num_groups + 1)]
        groups = [order[start:end] for start, end in zip(bounds, bounds[1:])]
        padded = sum(len(group) * _round_up(context_lens[group[-1]], block_size) for group in groups)
        cost = padded + GROUP_OVERHEAD_KEY_POSITIONS * (num_groups - 1)
        if cost < best_cost:
            best_groups, best_cost = groups, cost
    return best_groups


def plan_prefill_chunks(metadata: AttentionMetadata, block_size: int) -> list[PrefillChunk]:
    chunks = []
    first_row = metadata.num_decode_tokens
    for query_len, context_len, block_table in zip(
            metadata.prefill_query_lens, metadata.prefill_context_lens, metadata.prefill_block_tables):
        num_blocks = blocks_for_tokens(context_len, block_size)
        chunks.append(PrefillChunk(first_row, query_len, context_len, block_table[:num_blocks]))
        first_row += query_len
    return chunks


def offset_causal_mask(query_len: int, context_len: int) -> torch.Tensor:
    """Row i (context position context_len - query_len + i) sees positions up to its own."""
    row_positions = torch.arange(context_len - query_len, context_len)
    return torch.arange(context_len)[None, :] <= row_positions[:, None]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))


def _decode_group(rows: torch.Tensor | None, block_tables: torch.Tensor, context_lens: torch.Tensor,
                  block_size: int) -> DecodeGroup:
    num_blocks = blocks_for_tokens(int(context_lens.max()), block_size)
    padded_len = num_blocks * block_size
    is_in_context = torch.arange(padded_len) < context_lens[:, None]
    return DecodeGroup(rows, block_tables[:, :num_blocks].reshape(-1), padded_len, is_in_context)


def _round_up(length: int, block_size: int) -> int:
    return blocks_for_tokens(length, block_size) * block_size
