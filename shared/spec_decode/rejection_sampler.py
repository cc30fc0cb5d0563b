"""Accept or reject proposed tokens so that the output follows the target distribution exactly.

The rule of Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative
Sampling": draft token x_j (drawn from the proposer's q_j) is accepted with probability
min(1, p_j(x_j) / q_j(x_j)); at the first rejection the token is drawn instead from
norm(max(0, p_j - q_j)) and the rest of the draft is dropped; when all k are accepted a bonus
token is drawn from p_{k+1}. p and q are the distributions AFTER the request's sampling
processing (penalties, temperature, top-k, top-p, min-p), so every emitted token follows the
same distribution as without speculation. A proposer without probabilities (n-gram) has a
point mass q (q(x) = 1).

Called by `Speculator.verify` on a padded batch of sampled (non-greedy) requests; greedy
requests take the argmax path in the speculator instead.
"""

from dataclasses import dataclass

import torch


@dataclass
class RejectionOutput:
    # (B, K + 1) int64: accepted draft tokens, then the recovered or bonus token; -1 after.
    token_ids: torch.Tensor
    # (B,) int64: accepted draft tokens per request (the emitted count is this + 1).
    num_accepted: torch.Tensor


def rejection_sample(target_probs: torch.Tensor, draft_token_ids: torch.Tensor,
                     draft_probs: torch.Tensor | None, num_drafts: torch.Tensor,
                     uniforms: torch.Tensor) -> RejectionOutput:
    """target_probs: (B, K + 1, V) p at each draft position and after the last;
    draft_token_ids: (B, K) int64, padded past each row's `num_drafts` (B,);
    draft_probs: (B, K, V) q, or None for point masses at the draft tokens;
    uniforms: (B, K + 1) in [0, 1): K acceptance tests, then the final draw."""
    batch, max_k = draft_token_ids.shape
    positions = torch.arange(max_k)
    is_drafted = positions[None, :] < num_drafts[:, None]
    safe_ids = draft_token_ids.clamp(min=0)
    accept_probs = acceptance_probabilities(target_probs[:, :max_k], safe_ids, draft_probs)
    is_accepted = (uniforms[:, :max_k] < accept_probs) & is_drafted
    num_accepted = is_accepted.long().cumprod(dim=1).sum(dim=1)
    final_probs = _final_distribution(target_probs, safe_ids, draft_probs, num_accepted, num_drafts)
    final_ids = sample_from_probs(final_probs, uniforms[:, max_k])
    token_ids = torch.full((batch, max_k + 1), -1, dtype=torch.long)
    keep = positions[None, :] < num_accepted[:, None]
    token_ids[:, :max_k] = torch.where(keep, draft_token_ids, -1)
    token_ids[torch.arange(batch), num_accepted] = final_ids
    return RejectionOutput(token_ids, num_accepted)


def acceptance_probabilities(target_probs: torch.Tensor, draft_token_ids: torch.Tensor,
                             draft_probs: torch.Tensor | None) -> torch.Tensor:
    """(B, K) min(1, p(x) / q(x)) of each draft token x."""
    index = draft_token_ids[..., None]
    p_of_draft = target_probs.gather(2, index).squeeze(2)
    if draft_probs is None:
        return p_of_draft.clamp(max=1.0)
    q_of_draft = draft_probs.gather(2, index).squeeze(2)
    ratio = p_of_draft / q_of_draft.clamp(min=torch.finfo(q_of_draft.dtype).tiny)
    return ratio.clamp(max=1.0)


def _final_distribution(target_probs: torch.Tensor, draft_token_ids: torch.Tensor,
                        draft_probs: torch.Tensor | None, num_accepted: torch.Tensor,
                        num_drafts: torch.Tensor) -> torch.Tensor:
    """(B, V): norm(max(0, p - q)) at the first rejected position, or p after the last draft."""
    rows = torch.arange(target_probs.shape[0])
    p = target_probs[rows, num_accepted]
    is_rejected = num_accepted < num_drafts
    if not bool(is_rejected.any()):
        return p
    at = num_accepted.clamp(max=draft_token_ids.shape[1] - 1)
    if draft_probs is None:
        q = torch.zeros_like(p)
        q[rows, draft_token_ids[rows, at]] = 1.0
    else:
        q = draft_probs[rows, at]
    residual = (p - q).clamp(min=0.0)
    # p == q leaves nothing (and never rejects); keep p then, so the draw is defined.
    has_mass = residual.sum(dim=1, keepdim=True) > 0
    residual = torch.where(has_mass, residual, p)
    return torch.where(is_rejected[:, None], residual, p)


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """(B,) int64: inverse-CDF draw in token-id order from unnormalized (B, V) weights, one
    uniform in [0, 1) per row; tokens of weight 0 are never picked."""
    cumulative = probs.cumsum(dim=1)
    totals = cumulative[:, -1:]
    below_total = torch.nextafter(totals, torch.zeros_like(totals))
    targets = torch.minimum(uniforms[:, None].to(probs.dtype) * totals, below_total)
    return torch.searchsorted(cumulative, targets, right=True).squeeze(1)
