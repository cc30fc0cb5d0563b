"""Speculation inside one model-runner step: propose, then verify what the target computed.

`ModelRunner.execute` calls `propose` with the rows the scheduler allowed to speculate
(`ScheduledRequest.num_spec_tokens > 0`), appends each proposal to its row's tokens so the
target computes all k + 1 positions in the same forward pass (one causal chunk over the
paged KV), then calls `verify` with those positions' logits. Greedy requests accept a draft
token while it equals the target's argmax (so the output is exactly the non-speculative
one); sampled requests go through `rejection_sampler`. KV written for rejected positions is
simply overwritten later: the scheduler counts only confirmed positions as computed.
"""

from collections.abc import Sequence

import torch

from shared.core.scheduler_output import ScheduledRequest
from shared.core.verified_tokens import VerifiedTokens
from shared.sampling.sampler import apply_history
from shared.spec_decode.draws import draw_per_request
from shared.spec_decode.history import verify_rows
from shared.spec_decode.outputs import Proposal
from shared.spec_decode.probs import processed_probs
from shared.spec_decode.proposer import Proposer
from shared.spec_decode.rejection_sampler import rejection_sample


class Speculator:
    def __init__(self, proposer: Proposer, global_generator: torch.Generator | None = None):
        self.proposer = proposer
        self.global_generator = global_generator

    def propose(self, items: Sequence[ScheduledRequest],
                generators: Sequence[torch.Generator | None]) -> dict[str, Proposal]:
        proposals = self.proposer.propose(items, generators)
        return {item.request_id: proposal for item, proposal in zip(items, proposals)}

    def verify(self, items: Sequence[ScheduledRequest], logits: torch.Tensor, first_rows: Sequence[int],
               proposals: Sequence[Proposal], generators: Sequence[torch.Generator | None]
               ) -> dict[str, VerifiedTokens]:
        """`items[i]`'s k + 1 positions have logits rows first_rows[i] .. first_rows[i] + k."""
        groups: dict[bool, list[int]] = {True: [], False: []}
        for index, item in enumerate(items):
            groups[item.sampling_params.is_greedy].append(index)
        results: dict[str, VerifiedTokens] = {}
        for is_greedy, indices in groups.items():
            if not indices:
                continue
            verify = self._verify_greedy if is_greedy else self._verify_sampled
            token_lists = verify([items[i] for i in indices], logits, [first_rows[i] for i in indices],
                                 [proposals[i] for i in indices], [generators[i] for i in indices])
            for index, token_ids in zip(indices, token_lists):
                results[items[index].request_id] = _verified(items[index], proposals[index], token_ids)
        return results

    def _verify_greedy(self, items, logits, first_rows, proposals, generators) -> list[list[int]]:
        row_ids, rows = _position_rows(items, first_rows, proposals)
        targets = apply_history(logits[row_ids].float(), rows).argmax(dim=-1).tolist()
        token_lists, offset = [], 0
        for proposal in proposals:
            drafts = proposal.draft_token_ids
            chosen = targets[offset:offset + len(drafts) + 1]
            num_accepted = 0
            while num_accepted < len(drafts) and drafts[num_accepted] == chosen[num_accepted]:
                num_accepted += 1
            token_lists.append(drafts[:num_accepted] + [chosen[num_accepted]])
            offset += len(drafts) + 1
        return token_lists

    def _verify_sampled(self, items, logits, first_rows, proposals, generators) -> list[list[int]]:
        row_ids, rows = _position_rows(items, first_rows, proposals)
        flat_probs = processed_probs(logits[row_ids], rows)
        nums = [len(proposal.draft_token_ids) for proposal in proposals]
        max_k, vocab_size = max(nums), flat_probs.shape[1]
        target = flat_probs.new_zeros(len(items), max_k + 1, vocab_size)
        draft_ids = torch.zeros(len(items), max_k, dtype=torch.long)
        offset = 0
        for index, (num, proposal) in enumerate(zip(nums, proposals)):
            target[index, :num + 1] = flat_probs[offset:offset + num + 1]
            draft_ids[index, :num] = torch.tensor(proposal.draft_token_ids, dtype=torch.long)
            offset += num + 1
        uniforms = self._uniforms(generators, nums, max_k)
        output = rejection_sample(target, draft_ids, _draft_probs(proposals, draft_ids, vocab_size),
                                  torch.tensor(nums), uniforms)
        return [row[:int(count) + 1] for row, count in zip(output.token_ids.tolist(), output.num_accepted)]

    def _uniforms(self, generators, nums: list[int], max_k: int) -> torch.Tensor:
        """(B, K + 1): each request's k acceptance uniforms, then its final one in column K."""
        draws = draw_per_request(generators, [num + 1 for num in nums], self.global_generator)
        uniforms = torch.ones(len(nums), max_k + 1)
        for index, (num, drawn) in enumerate(zip(nums, draws)):
            uniforms[index, :num] = drawn[:num]
            uniforms[index, max_k] = drawn[num]
        return uniforms


def _position_rows(items, first_rows, proposals):
    """Logits row ids and sampling rows of every verified position, request by request."""
    row_ids, rows = [], []
    for item, first_row, proposal in zip(items, first_rows, proposals):
        row_ids.extend(range(first_row, first_row + len(proposal.draft_token_ids) + 1))
        rows.extend(verify_rows(item, proposal.draft_token_ids))
    return torch.tensor(row_ids, dtype=torch.long), rows


def _draft_probs(proposals: Sequence[Proposal], draft_ids: torch.Tensor, vocab_size: int) -> torch.Tensor | None:
    """(B, K, V) q, point masses written as one-hot rows; None when every proposal is one."""
    if all(proposal.draft_probs is None for proposal in proposals):
        return None
    probs = torch.zeros(*draft_ids.shape, vocab_size)
    for index, proposal in enumerate(proposals):
        num = len(proposal.draft_token_ids)
        if proposal.draft_probs is None:
            probs[index, torch.arange(num), draft_ids[index, :num]] = 1.0
        else:
            probs[index, :num] = proposal.draft_probs
    return probs


def _verified(item: ScheduledRequest, proposal: Proposal, token_ids: list[int]) -> VerifiedTokens:
    """Draft KV is confirmed up to the last accepted token the draft itself computed."""
    num_computed = min(proposal.num_draft_computed_tokens, item.start_position + len(token_ids))
    return VerifiedTokens(token_ids, len(proposal.draft_token_ids), num_computed)
