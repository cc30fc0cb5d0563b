"""The distribution a request's sampling settings turn logits into, as full-vocabulary probs.

The same processing as `shared.sampling.sampler.Sampler` (min_tokens suppression, penalties,
then top-k, temperature, top-p, min-p through `shared.sampling.candidates`), but returning
the probabilities instead of drawing: the rejection sampler needs p (target) and q (draft)
themselves. Greedy rows become a point mass at the argmax of their adjusted logits, the token
the Sampler would pick.
"""

import torch

from shared.sampling.candidates import (
    apply_top_p_and_min_p, compact_top_k_candidates, full_vocab_candidates, is_compactable)
from shared.sampling.sampler import SamplingRow, apply_history


def processed_probs(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """(R, V) float32 probabilities of `logits` (R, V), row i processed by `rows[i]`."""
    adjusted = apply_history(logits.float(), rows)
    probs = torch.zeros_like(adjusted)
    greedy = [index for index, row in enumerate(rows) if row.params.is_greedy]
    if greedy:
        selected = torch.tensor(greedy)
        probs[selected, adjusted[selected].argmax(dim=-1)] = 1.0
    vocab_size = logits.shape[1]
    for wants_compact in (True, False):
        group = [index for index, row in enumerate(rows) if not row.params.is_greedy
                 and is_compactable(row.params, vocab_size) == wants_compact]
        if group:
            probs[torch.tensor(group)] = _sampled_probs(adjusted[torch.tensor(group)],
                                                        [rows[index] for index in group], wants_compact)
    return probs


def _sampled_probs(logits: torch.Tensor, rows: list[SamplingRow], is_compact: bool) -> torch.Tensor:
    params_list = [row.params for row in rows]
    build = compact_top_k_candidates if is_compact else full_vocab_candidates
    candidates = build(logits, params_list)
    apply_top_p_and_min_p(candidates, params_list)
    candidate_probs = torch.softmax(candidates.logits, dim=-1)
    if candidates.token_ids is None:
        return candidate_probs
    probs = torch.zeros_like(logits)
    return probs.scatter_(1, candidates.token_ids, candidate_probs)
