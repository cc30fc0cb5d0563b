"""The tokens a sampled row may still pick, after temperature, top-k, top-p and min-p.

Called by `Sampler` for the rows that are not greedy, on their (penalized) logits. Top-k is
decided on those logits, then the survivors are divided by the row's temperature. Rows
whose top-k is small are compacted to their top-k survivors, so top-p, min-p and the draw
work on (num_rows, ~k) tensors instead of the whole vocabulary; the other rows keep the
full vocabulary. Masked tokens hold -inf.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from shared.sampling.logits_masks import (
    mask_below, min_p_thresholds, top_k_thresholds, top_p_thresholds, top_p_thresholds_sorted)
from shared.sampling.params import SamplingParams

# Rows with 0 < top_k <= this are compacted to their survivors.
MAX_COMPACT_TOP_K = 1024


@dataclass
class Candidates:
    # (num_rows, width) float32; -inf marks a token that cannot be picked.
    logits: torch.Tensor
    # (num_rows, width) int64 token id of each column, columns sorted by logit from high to
    # low; None when column j is token j (the whole vocabulary, unsorted).
    token_ids: torch.Tensor | None


def is_compactable(params: SamplingParams, vocab_size: int) -> bool:
    """True when a row's top-k makes it worth working on its top-k survivors only."""
    return 0 < params.top_k <= MAX_COMPACT_TOP_K and params.top_k < vocab_size


def compact_top_k_candidates(logits: torch.Tensor,
                             params_list: Sequence[SamplingParams]) -> Candidates:
    """Top-k survivors, divided by temperature, of rows that all pass `is_compactable`.

    `logits` is not modified. Rows are padded with -inf to the widest row's survivor count.
    """
    top_ks = torch.tensor([params.top_k for params in params_list], device=logits.device)
    max_k = int(top_ks.max())
    # One extra column tells whether a row has ties with its k-th logit beyond max_k.
    width = min(max_k + 1, logits.shape[1])
    values, token_ids = logits.topk(width, dim=-1)
    thresholds = values.gather(1, top_ks[:, None] - 1)
    if width > max_k and bool((values[:, -1:] >= thresholds).any()):
        num_survivors = int((logits >= thresholds).sum(dim=-1).max())
        values, token_ids = logits.topk(num_survivors, dim=-1)
    mask_below(values, thresholds)
    values /= _temperatures(params_list, logits.device)
    return Candidates(values, token_ids)


def full_vocab_candidates(logits: torch.Tensor,
                          params_list: Sequence[SamplingParams]) -> Candidates:
    """Whole-vocabulary rows divided by temperature, with any (large) top-k masked.

    `logits` is not modified; top-k is decided on it, before temperature, as for compact rows.
    """
    scaled = logits / _temperatures(params_list, logits.device)
    row_ids = [index for index, params in enumerate(params_list)
               if 0 < params.top_k < logits.shape[1]]
    if row_ids:
        selected = torch.tensor(row_ids, device=logits.device)
        top_ks = torch.tensor([params_list[index].top_k for index in row_ids],
                              device=logits.device)
        thresholds = torch.full((len(params_list), 1), float("-inf"), device=logits.device)
        thresholds[selected] = top_k_thresholds(logits[selected], top_ks)
        scaled.masked_fill_(logits < thresholds, float("-inf"))
    return Candidates(scaled, None)


def apply_top_p_and_min_p(candidates: Candidates,
                          params_list: Sequence[SamplingParams]) -> None:
    """Mask, in place, what top-p and then min-p remove from each row's candidates."""
    is_sorted = candidates.token_ids is not None

    def top_p_of(rows: torch.Tensor, row_ids: list[int]) -> torch.Tensor:
        top_ps = _column([params_list[index].top_p for index in row_ids], rows.device)
        if is_sorted:
            return top_p_thresholds_sorted(rows, top_ps)
        return top_p_thresholds(rows, top_ps)

    def min_p_of(rows: torch.Tensor, row_ids: list[int]) -> torch.Tensor:
        min_ps = _column([params_list[index].min_p for index in row_ids], rows.device)
        return min_p_thresholds(rows, min_ps)

    top_p_rows = [index for index, params in enumerate(params_list) if params.uses_top_p]
    _mask_rows(candidates.logits, top_p_rows, top_p_of)
    min_p_rows = [index for index, params in enumerate(params_list) if params.uses_min_p]
    _mask_rows(candidates.logits, min_p_rows, min_p_of)


def _mask_rows(logits: torch.Tensor, row_ids: list[int],
               thresholds_of: Callable[[torch.Tensor, list[int]], torch.Tensor]) -> None:
    """Mask, in place, the rows `row_ids` below the thresholds `thresholds_of(rows, row_ids)`."""
    if not row_ids:
        return
    if len(row_ids) == logits.shape[0]:
        mask_below(logits, thresholds_of(logits, row_ids))
        return
    selected = torch.tensor(row_ids, device=logits.device)
    rows = logits[selected]
    mask_below(rows, thresholds_of(rows, row_ids))
    logits[selected] = rows


def _temperatures(params_list: Sequence[SamplingParams], device: torch.device) -> torch.Tensor:
    # A temperature beyond float32 (1e300) would be inf, and -inf / inf is NaN.
    return _column([params.temperature for params in params_list], device).clamp(max=torch.finfo(torch.float32).max)


def _column(values: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)[:, None]
