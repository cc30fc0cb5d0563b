"""What verifying a speculating request's draft tokens hands back to the scheduler."""

from dataclasses import dataclass


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
