"""The proposer interface, and the n-gram proposer behind it.

`Speculator.propose` calls `propose(items, generators)` at the start of a model-runner step
with the rows that may speculate (`ScheduledRequest.num_spec_tokens > 0`); each proposal has
at most that many tokens (the slots the scheduler allocated).
"""

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from shared.core.scheduler_output import ScheduledRequest
from shared.spec_decode.ngram import find_ngram_proposal
from shared.spec_decode.outputs import Proposal


class Proposer(ABC):
    @abstractmethod
    def propose(self, items: Sequence[ScheduledRequest],
                generators: Sequence[torch.Generator | None]) -> list[Proposal]:
        """One proposal per item; `generators[i]` is item i's seeded generator (or None)."""


class NgramProposer(Proposer):
    """Prompt lookup over each request's prompt + output (`shared.spec_decode.ngram`)."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, items: Sequence[ScheduledRequest],
                generators: Sequence[torch.Generator | None]) -> list[Proposal]:
        proposals = []
        for item in items:
            token_ids = [*item.prompt_token_ids, *item.output_token_ids]
            proposals.append(Proposal(find_ngram_proposal(token_ids, item.num_spec_tokens,
                                                          self.min_n, self.max_n)))
        return proposals
