"""Build the flat-batch inputs of one step (positions, slots, AttentionMetadata) by hand.

The model runner does this from the scheduler's output; the attention and model tests use this
small stand-in to describe a step directly as "these sequences, with these blocks".
"""

from dataclasses import dataclass

import torch

from shared.attention.metadata import AttentionMetadata


@dataclass
class StepSequence:
    block_ids: list[int]
    # Tokens the sequence holds once this step's tokens are stored.
    context_len: int
    # New tokens this step: the last `query_len` positions of the context.
    query_len: int = 1

    @property
    def positions(self) -> list[int]:
        return list(range(self.context_len - self.query_len, self.context_len))


@dataclass
class PagedBatch:
    positions: torch.Tensor
    metadata: AttentionMetadata


def slot_of(block_ids: list[int], position: int, block_size: int) -> int:
    return block_ids[position // block_size] * block_size + position % block_size


def build_batch(decodes: list[StepSequence], prefills: list[StepSequence], block_size: int) -> PagedBatch:
    """Rows: one per decode (query_len must be 1), then each prefill chunk's rows."""
    assert all(seq.query_len == 1 for seq in decodes)
    ordered = decodes + prefills
    positions = [p for seq in ordered for p in seq.positions]
    slots = [slot_of(seq.block_ids, p, block_size) for seq in ordered for p in seq.positions]
    width = max((len(seq.block_ids) for seq in decodes), default=0)
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        num_decode_tokens=len(decodes),
        decode_block_tables=torch.tensor([seq.block_ids + [0] * (width - len(seq.block_ids)) for seq in decodes],
                                         dtype=torch.long).view(len(decodes), width),
        decode_context_lens=torch.tensor([seq.context_len for seq in decodes], dtype=torch.long),
        prefill_query_lens=[seq.query_len for seq in prefills],
        prefill_context_lens=[seq.context_len for seq in prefills],
        prefill_block_tables=[torch.tensor(seq.block_ids, dtype=torch.long) for seq in prefills],
    )
    return PagedBatch(torch.tensor(positions, dtype=torch.long), metadata)
