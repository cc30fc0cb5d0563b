"""What proposers hand the verifier (the verifier's result is shared.core.verified_tokens)."""

from dataclasses import dataclass

import torch


@dataclass
class Proposal:
    """Tokens proposed for one request this step (made by a proposer in the model runner)."""
    draft_token_ids: list[int]
    # (len(draft_token_ids), V) q of each draft token; None: point masses at the draft tokens
    # (n-gram, or a greedy request's draft).
    draft_probs: torch.Tensor | None = None
    # Draft model: positions whose draft KV is now computed (the catch-up and every proposal
    # but the last); 0 for proposers without a KV cache.
    num_draft_computed_tokens: int = 0
