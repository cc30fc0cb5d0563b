"""What proposers hand the verifier, and what verification hands back to the scheduler."""

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


@dataclass
class VerifiedTokens:
    """One speculating request's step result (ModelRunnerOutput.verified)."""
    # Accepted draft tokens, then the recovered or bonus token: always at least one.
    token_ids: list[int]
    num_draft_tokens: int
    # Draft model: positions whose draft KV holds confirmed tokens after this step.
    num_draft_computed_tokens: int = 0

    @property
    def num_accepted(self) -> int:
        return len(self.token_ids) - 1
