"""The draft-model proposer: a smaller Llama-family model with its own paged KV cache.

The draft's KV tensor has the target's num_blocks and block_size and is indexed by the SAME
block tables: the target's allocator hands out blocks for both, and they are freed together.
Each request carries how many positions the draft has computed
(`ScheduledRequest.num_draft_computed_tokens`); proposing first runs the draft over every
position it has not computed yet ("catch-up": the whole prompt on the first decode step,
then the previous step's accepted and bonus tokens), in one flat batch with the other
requests, then k - 1 batched single-token steps. So the draft computes its prompt KV itself,
also on the decode side of a disaggregated deployment: the draft costs a fraction of the
target, the KV transfer format and the prefill service stay unchanged, and any draft works
with any prefill instance. Catch-up also rewrites any draft KV in prefix-cache blocks that
another request computed without the draft.
"""

from collections.abc import Sequence

import torch

from shared.core.input_batch import build_model_inputs
from shared.core.scheduler_output import ScheduledRequest
from shared.kv_cache.layout import KVCacheLayout
from shared.sampling.sampler import apply_history
from shared.spec_decode.draws import draw_per_request
from shared.spec_decode.history import draft_position_row
from shared.spec_decode.outputs import Proposal
from shared.spec_decode.probs import processed_probs
from shared.spec_decode.proposer import Proposer
from shared.spec_decode.rejection_sampler import sample_from_probs


class DraftModelProposer(Proposer):
    """Built by `shared.spec_decode.builder`; `Speculator.propose` calls `propose` each step."""

    def __init__(self, model: torch.nn.Module, layout: KVCacheLayout,
                 global_generator: torch.Generator | None = None):
        self.model = model
        self.layout = layout
        self.kv_cache = layout.allocate()
        self.global_generator = global_generator

    @torch.inference_mode()
    def propose(self, items: Sequence[ScheduledRequest],
                generators: Sequence[torch.Generator | None]) -> list[Proposal]:
        contexts = [[*item.prompt_token_ids, *item.output_token_ids] for item in items]
        drafts: list[list[int]] = [[] for _ in items]
        probs: list[list[torch.Tensor]] = [[] for _ in items]
        active = list(range(len(items)))
        batch = [_catch_up_row(item, context) for item, context in zip(items, contexts)]
        while active:
            logits = self._forward(batch)
            self._choose([items[i] for i in active], logits, [drafts[i] for i in active],
                         [probs[i] for i in active], [generators[i] for i in active])
            active = [i for i in active if len(drafts[i]) < items[i].num_spec_tokens]
            batch = [_next_draft_row(items[i], len(contexts[i]), drafts[i]) for i in active]
        return [Proposal(draft, torch.stack(q) if q else None, len(context) + len(draft) - 1)
                for draft, q, context in zip(drafts, probs, contexts)]

    def _forward(self, batch: list[ScheduledRequest]) -> torch.Tensor:
        """(len(batch), V) logits at each row's last position; writes the draft KV."""
        inputs = build_model_inputs(batch, self.layout.block_size)
        logits = self.model(inputs.input_ids, inputs.positions, self.kv_cache,
                            inputs.attn_metadata, inputs.logits_indices)
        in_batch_order = [inputs.sample_logit_rows[item.request_id] for item in batch]
        return logits[torch.tensor(in_batch_order, dtype=torch.long)]

    def _choose(self, items, logits, drafts, probs, generators) -> None:
        """Append one draft token per item: the argmax for greedy requests, else a draw from
        the processed q (kept in `probs` for the rejection sampler)."""
        rows = [draft_position_row(item, draft) for item, draft in zip(items, drafts)]
        chosen: dict[int, int] = {}
        for is_greedy in (True, False):
            group = [index for index, item in enumerate(items) if item.sampling_params.is_greedy == is_greedy]
            if not group:
                continue
            group_logits, group_rows = logits[torch.tensor(group)].float(), [rows[i] for i in group]
            if is_greedy:
                token_ids = apply_history(group_logits, group_rows).argmax(dim=-1).tolist()
            else:
                q = processed_probs(group_logits, group_rows)
                uniforms = draw_per_request([generators[i] for i in group], [1] * len(group),
                                            self.global_generator)
                token_ids = sample_from_probs(q, torch.cat(uniforms)).tolist()
                for position, index in enumerate(group):
                    probs[index].append(q[position])
            chosen.update(zip(group, token_ids))
        for index, draft in enumerate(drafts):
            draft.append(chosen[index])


def _catch_up_row(item: ScheduledRequest, context: list[int]) -> ScheduledRequest:
    """The positions the draft has not computed, up to the request's last token."""
    start = min(item.num_draft_computed_tokens, len(context) - 1)
    return _draft_row(item, context[start:], start)


def _next_draft_row(item: ScheduledRequest, context_len: int, draft: list[int]) -> ScheduledRequest:
    """The newest draft token, at the position after the previous one."""
    return _draft_row(item, draft[-1:], context_len + len(draft) - 1)


def _draft_row(item: ScheduledRequest, token_ids: list[int], start_position: int) -> ScheduledRequest:
    return ScheduledRequest(request_id=item.request_id, token_ids=token_ids, start_position=start_position,
                            block_ids=item.block_ids, sampling_params=item.sampling_params,
                            prompt_token_ids=item.prompt_token_ids, output_token_ids=item.output_token_ids)
