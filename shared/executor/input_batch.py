"""Flatten a step's scheduled requests into the model's tensors.

Rows are laid out as AttentionMetadata expects: single-token requests (decodes) first, then
one contiguous chunk per prompt-computing request.
"""

from dataclasses import dataclass, field

import torch

from shared.attention.metadata import AttentionMetadata
from shared.core.scheduler_output import ScheduledRequest


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    # Rows whose logits are computed, in this order.
    logits_indices: torch.Tensor
    # Position in the logits of each sampling request's row, keyed by request id.
    sample_logit_rows: dict[str, int] = field(default_factory=dict)
    # (first logits row, number of rows) of each request's prompt-logprob positions.
    prompt_logit_rows: dict[str, tuple[int, int]] = field(default_factory=dict)


def build_model_inputs(scheduled: list[ScheduledRequest], block_size: int) -> ModelInputs:
    decodes = [item for item in scheduled if item.is_decode]
    chunks = [item for item in scheduled if not item.is_decode]
    token_ids, positions, slots = [], [], []
    for item in decodes:
        token_ids.append(item.token_ids[0])
        positions.append(item.start_position)
        block_id = item.block_ids[item.start_position // block_size]
        slots.append(block_id * block_size + item.start_position % block_size)
    chunk_positions, chunk_slots, chunk_tables = [], [], []
    for item in chunks:
        token_ids.extend(item.token_ids)
        table = torch.tensor(item.block_ids, dtype=torch.long)
        pos = torch.arange(item.start_position, item.start_position + item.num_tokens)
        chunk_positions.append(pos)
        chunk_slots.append(table[pos // block_size] * block_size + pos % block_size)
        chunk_tables.append(table)
    positions_t = torch.cat([torch.tensor(positions, dtype=torch.long), *chunk_positions])
    slots_t = torch.cat([torch.tensor(slots, dtype=torch.long), *chunk_slots])
    metadata = AttentionMetadata(
        slot_mapping=slots_t,
        num_decode_tokens=len(decodes),
        decode_block_tables=_padded_tables([item.block_ids for item in decodes]),
        decode_context_lens=torch.tensor([item.start_position + 1 for item in decodes], dtype=torch.long),
        prefill_query_lens=[item.num_tokens for item in chunks],
        prefill_context_lens=[item.start_position + item.num_tokens for item in chunks],
        prefill_block_tables=chunk_tables,
    )
    inputs = ModelInputs(torch.tensor(token_ids, dtype=torch.long), positions_t, metadata,
                         logits_indices=torch.empty(0, dtype=torch.long))
    _select_logit_rows(inputs, decodes + chunks)
    return inputs


def _padded_tables(tables: list[list[int]]) -> torch.Tensor:
    width = max((len(table) for table in tables), default=0)
    return torch.tensor([table + [0] * (width - len(table)) for table in tables], dtype=torch.long)


def _select_logit_rows(inputs: ModelInputs, ordered: list[ScheduledRequest]) -> None:
    rows: list[int] = []
    first_row = 0
    for item in ordered:
        if item.prompt_logprob_targets:
            inputs.prompt_logit_rows[item.request_id] = (len(rows), len(item.prompt_logprob_targets))
            rows.extend(range(first_row, first_row + len(item.prompt_logprob_targets)))
        if item.sampling_params is not None:
            inputs.sample_logit_rows[item.request_id] = len(rows)
            rows.append(first_row + item.num_tokens - 1)
        first_row += item.num_tokens
    inputs.logits_indices = torch.tensor(rows, dtype=torch.long)
