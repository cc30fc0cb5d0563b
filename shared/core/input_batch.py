"""Flatten a step's scheduled requests into the model's tensors.

Rows are laid out as AttentionMetadata expects: single-token requests (decodes) first, then
one contiguous chunk per prompt-computing request. A speculating request's verified positions
(its last token plus the proposed ones) are decode rows too, one per position, each attending
to the context up to itself: the keys of every new token are stored before attention, so each
row computes exactly what a plain decode at that position would (greedy output then matches
non-speculative decoding bit for bit, in bfloat16 too).
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
    # Position in the logits of each sampling request's row, keyed by request id; a row with
    # draft tokens has len(draft_token_ids) + 1 consecutive logits rows from there.
    sample_logit_rows: dict[str, int] = field(default_factory=dict)
    # (first logits row, number of rows) of each request's prompt-logprob positions.
    prompt_logit_rows: dict[str, tuple[int, int]] = field(default_factory=dict)


def build_model_inputs(scheduled: list[ScheduledRequest], block_size: int) -> ModelInputs:
    decodes = [item for item in scheduled if item.is_decode or item.draft_token_ids]
    chunks = [item for item in scheduled if not (item.is_decode or item.draft_token_ids)]
    token_ids, positions, slots, decode_tables = [], [], [], []
    for item in decodes:
        for offset, token_id in enumerate(item.token_ids):
            position = item.start_position + offset
            token_ids.append(token_id)
            positions.append(position)
            slots.append(item.block_ids[position // block_size] * block_size + position % block_size)
            decode_tables.append(item.block_ids)
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
        num_decode_tokens=len(positions),
        decode_block_tables=_padded_tables(decode_tables),
        decode_context_lens=torch.tensor(positions, dtype=torch.long) + 1,
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
            num_sampled = len(item.draft_token_ids) + 1
            rows.extend(range(first_row + item.num_tokens - num_sampled, first_row + item.num_tokens))
        first_row += item.num_tokens
    inputs.logits_indices = torch.tensor(rows, dtype=torch.long)
