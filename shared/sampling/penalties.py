"""Logit changes that depend on a request's history: min_tokens suppression and penalties.

Called by `Sampler` on its own copy of the logits, only for the rows that need them, before
any temperature or masking. Semantics follow vLLM:
  * min_tokens: while fewer than `min_tokens` tokens were generated, the row's
    `stop_and_eos_token_ids` get -inf so generation cannot end early; except on a guided
    row whose grammar is complete (its bitmask allows only those ids): it ends with "stop".
  * repetition_penalty r: every token seen in the prompt or the output has a positive logit
    divided by r and a negative logit multiplied by r.
  * presence_penalty / frequency_penalty (output tokens only):
    logit -= frequency_penalty * count + presence_penalty * (count > 0).
"""

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from shared.guided.bitmask import allows_only

_FLOAT32 = torch.finfo(torch.float32)
# Largest magnitude a penalized logit keeps: far beyond any real logit, yet still finite
# after division by the smallest sampled temperature (1e-5).
MAX_PENALIZED_LOGIT = 1e30

if TYPE_CHECKING:
    from shared.sampling.sampler import SamplingRow


def is_suppressing_stops(row: "SamplingRow") -> bool:
    """True while `row` has generated fewer than min_tokens and has stop/EOS ids to hide,
    unless its guided bitmask allows nothing else (a complete grammar wins over min_tokens)."""
    if len(row.output_token_ids) >= row.params.min_tokens or not row.stop_and_eos_token_ids:
        return False
    return row.guided_bitmask is None or not allows_only(row.guided_bitmask, row.stop_and_eos_token_ids)


def suppress_stop_tokens(logits: torch.Tensor, rows: Sequence["SamplingRow"],
                         row_indices: Sequence[int]) -> None:
    """Set the stop/EOS ids of each row in `row_indices` to -inf, in place."""
    token_ids = [list(rows[index].stop_and_eos_token_ids) for index in row_indices]
    flat_rows = [index for index, ids in zip(row_indices, token_ids) for _ in ids]
    flat_ids = list(itertools.chain.from_iterable(token_ids))
    device = logits.device
    logits[torch.tensor(flat_rows, device=device), torch.tensor(flat_ids, device=device)] = (
        float("-inf"))


def apply_penalties(logits: torch.Tensor, rows: Sequence["SamplingRow"],
                    row_indices: Sequence[int]) -> None:
    """Apply repetition, presence and frequency penalties to the rows in `row_indices`, in place.

    Works on the (row, token) pairs of the history only, never on whole vocabulary rows.
    """
    repetition_rows = [index for index in row_indices
                       if rows[index].params.uses_repetition_penalty]
    if repetition_rows:
        _apply_repetition_penalty(logits, rows, repetition_rows)
    additive_rows = [index for index in row_indices
                     if rows[index].params.presence_penalty != 0
                     or rows[index].params.frequency_penalty != 0]
    if additive_rows:
        _apply_additive_penalties(logits, rows, additive_rows)


def _history_pairs(token_id_lists: Sequence[tuple[int, Sequence[int]]],
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten [(row, token ids)] into two int64 tensors: the row and the token of each pair."""
    lengths = torch.tensor([len(ids) for _, ids in token_id_lists], dtype=torch.long)
    row_ids = torch.repeat_interleave(
        torch.tensor([row for row, _ in token_id_lists], dtype=torch.long), lengths)
    token_ids = torch.tensor(list(itertools.chain.from_iterable(ids for _, ids in token_id_lists)),
                             dtype=torch.long)
    return row_ids.to(device), token_ids.to(device)


def _per_row(rows: Sequence["SamplingRow"], field: str, device: torch.device) -> torch.Tensor:
    """(num_rows,) float32 of one float parameter, to be indexed by row id."""
    return torch.tensor([float(getattr(row.params, field)) for row in rows], device=device)


def _apply_repetition_penalty(logits: torch.Tensor, rows: Sequence["SamplingRow"],
                              row_indices: Sequence[int]) -> None:
    histories = [(index, list(itertools.chain(rows[index].prompt_token_ids,
                                              rows[index].output_token_ids)))
                 for index in row_indices]
    row_ids, token_ids = _history_pairs(histories, logits.device)
    # Penalties that float32 rounds to 0 or inf (1e-300, 1e300) would make 0 * inf = NaN.
    penalties = _per_row(rows, "repetition_penalty", logits.device).clamp(_FLOAT32.tiny, _FLOAT32.max)[row_ids]
    values = logits[row_ids, token_ids]
    penalized = torch.where(values > 0, values / penalties, values * penalties)
    # Finite logits stay finite (an overflow to +inf would make softmax NaN); masks stay -inf.
    penalized = torch.where(torch.isfinite(values), penalized.clamp(-MAX_PENALIZED_LOGIT, MAX_PENALIZED_LOGIT),
                            values)
    # A token seen twice is written twice with the same value: no double penalty.
    logits[row_ids, token_ids] = penalized


def _apply_additive_penalties(logits: torch.Tensor, rows: Sequence["SamplingRow"],
                              row_indices: Sequence[int]) -> None:
    outputs = [(index, rows[index].output_token_ids) for index in row_indices]
    row_ids, token_ids = _history_pairs(outputs, logits.device)
    vocab_size = logits.shape[1]
    keys, counts = torch.unique(row_ids * vocab_size + token_ids, return_counts=True)
    row_ids, token_ids = keys // vocab_size, keys % vocab_size
    frequency = _per_row(rows, "frequency_penalty", logits.device)[row_ids]
    presence = _per_row(rows, "presence_penalty", logits.device)[row_ids]
    logits[row_ids, token_ids] -= frequency * counts.float() + presence
