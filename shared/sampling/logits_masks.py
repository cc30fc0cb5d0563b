"""Exact top-k / top-p / min-p truncation, expressed as one logit threshold per row.

Each function returns a (num_rows, 1) tensor of thresholds; the caller drops every token whose
logit is below its row's threshold (`mask_below`). Working with thresholds makes the
tie rules simple and order-independent:
  * top-k keeps every token whose logit is >= the k-th largest logit, so tokens tied with the
    k-th one all survive (more than k tokens may remain; never fewer than min(k, vocab)).
  * top-p keeps the smallest set of most likely tokens whose cumulative probability reaches
    top_p (always at least the most likely token), plus every token tied with the least
    likely member of that set.
  * min-p keeps the tokens with probability >= min_p * (probability of the most likely token).
Called by `shared.sampling.candidates` after temperature scaling.
"""

import torch
import torch.nn.functional as F

# Widths of the sorted prefixes tried before sorting a whole vocabulary row for top-p.
TOP_P_PREFIX_WIDTHS = (256, 4096)


def mask_below(logits: torch.Tensor, thresholds: torch.Tensor) -> None:
    """Set logits below their row's threshold to -inf, in place."""
    logits.masked_fill_(logits < thresholds, float("-inf"))


def top_k_thresholds(logits: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    """The k-th largest logit of each row; `top_ks` is (num_rows,) int64 in [1, vocab]."""
    max_k = int(top_ks.max())
    top_values = logits.topk(max_k, dim=-1).values
    return top_values.gather(1, top_ks[:, None] - 1)


def top_p_thresholds_sorted(sorted_logits: torch.Tensor, top_ps: torch.Tensor,
                            total_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Top-p thresholds from rows already sorted from high to low (with every token present).

    `top_ps` is (num_rows, 1). The probability mass is measured as weights
    exp(logit - row max) against `total_weights` (default: the sum of the sorted row).
    """
    weights = torch.exp(sorted_logits - sorted_logits[:, :1])
    cumulative = weights.cumsum(dim=-1)
    if total_weights is None:
        total_weights = cumulative[:, -1:]
    mass_before = F.pad(cumulative[:, :-1], (1, 0))
    num_kept = (mass_before < top_ps * total_weights).sum(dim=-1, keepdim=True)
    # A top_p that float32 rounds to 0 (e.g. 1e-300) keeps the most likely token, never none.
    return sorted_logits.gather(1, num_kept.clamp(min=1) - 1)


def top_p_thresholds(logits: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Top-p thresholds for unsorted rows (the whole vocabulary), `top_ps` (num_rows, 1).

    Sorting 49k logits per row is slow, so the answer is first sought in the top 256, then
    4096, logits of each row; only rows whose kept set is longer than that are fully sorted.
    The result is exact either way.
    """
    row_max = logits.max(dim=-1, keepdim=True).values
    total_weights = torch.exp(logits - row_max).sum(dim=-1, keepdim=True)
    thresholds = torch.empty_like(row_max)
    pending = torch.arange(logits.shape[0], device=logits.device)
    for width in TOP_P_PREFIX_WIDTHS:
        if width >= logits.shape[1] or pending.numel() == 0:
            break
        prefix = logits[pending].topk(width, dim=-1).values
        found = top_p_thresholds_sorted(prefix, top_ps[pending], total_weights[pending])
        # A threshold above the prefix's last logit means the kept set ends inside the
        # prefix; one equal to it may continue beyond (or tie with tokens beyond it).
        is_resolved = (found > prefix[:, -1:]).squeeze(1)
        thresholds[pending[is_resolved]] = found[is_resolved]
        pending = pending[~is_resolved]
    if pending.numel() > 0:
        full_sorted = logits[pending].sort(dim=-1, descending=True).values
        thresholds[pending] = top_p_thresholds_sorted(
            full_sorted, top_ps[pending], total_weights[pending])
    return thresholds


def min_p_thresholds(logits: torch.Tensor, min_ps: torch.Tensor) -> torch.Tensor:
    """Min-p thresholds, `min_ps` (num_rows, 1): the lowest logit whose probability is at least
    min_p times the top probability (+inf when none, which never happens: the top qualifies)."""
    weights = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
    qualifying = logits.masked_fill(weights < min_ps, float("inf"))
    return qualifying.min(dim=-1, keepdim=True).values
