"""Counters of proposed and accepted tokens, kept on the engine (`EngineCore.spec_stats`).

The engine records one draft per speculating request and step; metrics exporters read the
fields as they are.
"""

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    # Verifications of at least one proposed token (one per request and step).
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # accepted_per_position[i]: drafts whose token i (0-based) was accepted.
    accepted_per_position: list[int] = field(default_factory=list)
    # proposed_per_position[i]: drafts that had a token i.
    proposed_per_position: list[int] = field(default_factory=list)

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One verified draft of `num_draft_tokens` tokens, the first `num_accepted` accepted."""
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        _count_positions(self.proposed_per_position, num_draft_tokens)
        _count_positions(self.accepted_per_position, num_accepted)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_per_draft(self) -> float:
        return self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def acceptance_rate_per_position(self) -> list[float]:
        """Share of the drafts reaching position i whose token i was accepted."""
        accepted = self.accepted_per_position + [0] * (len(self.proposed_per_position)
                                                       - len(self.accepted_per_position))
        return [num / total for num, total in zip(accepted, self.proposed_per_position)]


def _count_positions(counts: list[int], num_positions: int) -> None:
    if len(counts) < num_positions:
        counts.extend([0] * (num_positions - len(counts)))
    for index in range(num_positions):
        counts[index] += 1
