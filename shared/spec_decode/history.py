"""Sampling rows for positions inside a draft: the history grows with the draft tokens.

Position j of a speculating request (j draft tokens past its confirmed output) is sampled as
if those j tokens had been generated: penalties count them and min_tokens sees a longer
output. Used for the target's p (`Speculator.verify`) and the draft model's q.
"""

from collections.abc import Sequence

from shared.core.scheduler_output import ScheduledRequest
from shared.sampling.penalties import is_suppressing_stops
from shared.sampling.sampler import SamplingRow


def draft_position_row(item: ScheduledRequest, draft_token_ids: Sequence[int]) -> SamplingRow:
    """The sampling row of the position after `draft_token_ids` (drafts so far). The drafts
    join the output history only where processing depends on it: penalties, or min_tokens
    still hiding the stop ids at the confirmed output's length."""
    row = SamplingRow(params=item.sampling_params, prompt_token_ids=item.prompt_token_ids,
                      output_token_ids=item.output_token_ids, generator=None,
                      stop_and_eos_token_ids=item.stop_and_eos_token_ids)
    if draft_token_ids and (row.params.needs_penalties or is_suppressing_stops(row)):
        row.output_token_ids = [*item.output_token_ids, *draft_token_ids]
    return row


def verify_rows(item: ScheduledRequest, draft_token_ids: Sequence[int]) -> list[SamplingRow]:
    """One row per verified position: before each draft token, and after the last."""
    return [draft_position_row(item, draft_token_ids[:j]) for j in range(len(draft_token_ids) + 1)]
