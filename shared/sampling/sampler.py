"""The batched sampler: one token per logits row, called by the model runner once per step.

Order of processing (vLLM's):
  1. min_tokens suppression of stop/EOS ids, repetition penalty, presence/frequency penalties
     (`shared.sampling.penalties`; only rows that need them, on a copy of the logits), then
     guided decoding's token bitmask on constrained rows (`shared.guided.bitmask`);
  2. greedy rows (temperature < 1e-5) take the argmax (lowest id on ties);
  3. sampled rows: mask top-k, divide by temperature, mask top-p, then min-p
     (`shared.sampling.candidates`), then draw by inverse CDF (`shared.sampling.random_draw`).
Logprobs are computed from the logits as given (`shared.sampling.logprobs`).
When every row is greedy without penalties the whole step is a single pass over the logits
(each row's maximum and its position at once).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from shared.guided.bitmask import apply_token_bitmasks
from shared.sampling.candidates import (
    apply_top_p_and_min_p, compact_top_k_candidates, full_vocab_candidates, is_compactable)
from shared.sampling.logprobs import sampled_and_top_logprobs
from shared.sampling.params import SamplingParams
from shared.sampling.penalties import apply_penalties, is_suppressing_stops, suppress_stop_tokens
from shared.sampling.random_draw import draw_tokens, draw_uniforms, make_generator

__all__ = ["Sampler", "SamplerOutput", "SamplingRow", "apply_history", "make_generator"]


@dataclass
class SamplingRow:
    """One row of logits = one request this step."""
    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]  # tokens generated so far (penalties, min_tokens)
    generator: torch.Generator | None  # a seeded request's own generator; None: the global one
    # Ids suppressed while len(output_token_ids) < min_tokens (EOS unless ignore_eos, and
    # stop_token_ids).
    stop_and_eos_token_ids: Sequence[int] = ()
    # Guided decoding: the tokens this row may take, one bit each (shared.guided.bitmask);
    # None: unconstrained.
    guided_bitmask: torch.Tensor | None = None


@dataclass
class SamplerOutput:
    sampled_token_ids: list[int]
    # Logprob of each row's sampled token; None unless some row asked for logprobs.
    sampled_logprobs: list[float] | None = None
    # Per row, its params.logprobs most likely (token id, logprob), most likely first
    # ([] for rows that did not ask); None unless some row asked.
    top_logprobs: list[list[tuple[int, float]]] | None = None


class Sampler:
    def __init__(self, global_generator: torch.Generator | None = None):
        """`global_generator` serves unseeded rows; None means torch's default generator."""
        self.global_generator = global_generator

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
        """Pick one token per row of `logits` (num_rows, vocab), row i following `rows[i]`."""
        _check_batch(logits, rows)
        wants_logprobs = any(row.params.logprobs is not None for row in rows)
        if all(row.params.is_greedy for row in rows) and not wants_logprobs and not needs_history(rows):
            # One pass over the logits as the model gave them (bf16 for a bf16 model: widening is
            # exact, so the argmax is the same): each row's maximum (checked) and where it is
            # (the lowest id on ties, as argmax).
            row_max, token_ids = logits.max(dim=-1)
            _check_row_maxima(row_max)
            return SamplerOutput(sampled_token_ids=token_ids.tolist())
        raw_logits = logits.float()
        adjusted = apply_history(raw_logits, rows)
        if all(row.params.is_greedy for row in rows):
            row_max, token_ids = adjusted.max(dim=-1)
            _check_row_maxima(row_max)
        else:
            _check_some_token_allowed(adjusted)
            token_ids = self._choose_tokens(adjusted, rows)
        output = SamplerOutput(sampled_token_ids=token_ids.tolist())
        if wants_logprobs:
            nums_top = [row.params.logprobs or 0 for row in rows]
            output.sampled_logprobs, output.top_logprobs = sampled_and_top_logprobs(
                raw_logits, token_ids, nums_top)
        return output

    def _choose_tokens(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """(num_rows,) int64: argmax for greedy rows, a random draw for the others (some row
        is not greedy)."""
        sampled_rows = [index for index, row in enumerate(rows) if not row.params.is_greedy]
        token_ids = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        greedy_rows = [index for index, row in enumerate(rows) if row.params.is_greedy]
        if greedy_rows:
            greedy = torch.tensor(greedy_rows, device=logits.device)
            token_ids[greedy] = logits[greedy].argmax(dim=-1)
        sampled = torch.tensor(sampled_rows, device=logits.device)
        sampled_logits = logits if not greedy_rows else logits[sampled]
        token_ids[sampled] = self._sample(sampled_logits, [rows[index] for index in sampled_rows])
        return token_ids

    def _sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """Draw for non-greedy rows; `logits` (those rows) is left unchanged."""
        params_list = [row.params for row in rows]
        uniforms = draw_uniforms([row.generator for row in rows], self.global_generator)
        token_ids = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        vocab_size = logits.shape[1]
        is_compact = [is_compactable(params, vocab_size) for params in params_list]
        for wants_compact in (True, False):
            group = [index for index, flag in enumerate(is_compact) if flag == wants_compact]
            if not group:
                continue
            selected = torch.tensor(group, device=logits.device)
            group_params = [params_list[index] for index in group]
            build = compact_top_k_candidates if wants_compact else full_vocab_candidates
            group_logits = logits if len(group) == len(rows) else logits[selected]
            candidates = build(group_logits, group_params)
            apply_top_p_and_min_p(candidates, group_params)
            token_ids[selected] = draw_tokens(candidates, uniforms[group])
        return token_ids


def _check_batch(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    if logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(f"logits must be (num_rows={len(rows)}, vocab), got {tuple(logits.shape)}")


class NoTokenAllowedError(ValueError):
    """A row's logits leave nothing to sample (every token masked, or NaN)."""


def _check_some_token_allowed(logits: torch.Tensor) -> None:
    """Raise when a row has no finite maximum: all -inf (nothing allowed) or NaN. The model
    runner then retries rows alone, so only the bad row's request fails."""
    _check_row_maxima(logits.max(dim=-1).values)


def _check_row_maxima(row_max: torch.Tensor) -> None:
    if not bool(torch.isfinite(row_max).all()):
        bad = (~torch.isfinite(row_max)).nonzero().flatten().tolist()
        raise NoTokenAllowedError(f"no token can be sampled for rows {bad} (every token masked or NaN logits)")


def needs_history(rows: list[SamplingRow]) -> bool:
    """Whether some row needs min_tokens suppression, penalties or a guided bitmask."""
    return any(is_suppressing_stops(row) or row.params.needs_penalties or row.guided_bitmask is not None
               for row in rows)


def apply_history(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """(Also used by `shared.spec_decode.probs`.) `logits` itself when no row needs min_tokens suppression, penalties or a guided
    bitmask, else a copy with them applied (the bitmask last)."""
    suppressing_rows = [index for index, row in enumerate(rows) if is_suppressing_stops(row)]
    penalized_rows = [index for index, row in enumerate(rows) if row.params.needs_penalties]
    guided_rows = [index for index, row in enumerate(rows) if row.guided_bitmask is not None]
    if not suppressing_rows and not penalized_rows and not guided_rows:
        return logits
    adjusted = logits.clone()
    if suppressing_rows:
        suppress_stop_tokens(adjusted, rows, suppressing_rows)
    if penalized_rows:
        apply_penalties(adjusted, rows, penalized_rows)
    if guided_rows:
        apply_token_bitmasks(adjusted, [rows[index].guided_bitmask for index in guided_rows], guided_rows)
    return adjusted
