"""Drawing one token per row from its candidates, by inverse CDF with one uniform per row.

Called by `Sampler` once the candidates are final. Each row uses exactly one uniform number:
a seeded row takes it from its own generator, the other rows share the global generator.
Candidates are walked in token-id order (masked ones last), so a row's pick depends only on
its own probabilities and its own uniform: never on the other rows in the batch, their
order, or whether the row was compacted.
"""

from collections.abc import Sequence

import torch

from shared.sampling.candidates import Candidates

_NO_TOKEN = torch.iinfo(torch.int64).max


def make_generator(seed: int) -> torch.Generator:
    """A CPU generator for one seeded request; the model runner keeps it for the request's life."""
    return torch.Generator(device="cpu").manual_seed(seed % 2**64)


def skip_draws(generator: torch.Generator, num_draws: int) -> None:
    """Advance a seeded request's generator past the draws of tokens sampled elsewhere (a
    prefill instance sampled the first token), so its later draws match a local run."""
    for _ in range(num_draws):
        torch.rand(1, generator=generator)


def draw_uniforms(generators: Sequence[torch.Generator | None],
                  global_generator: torch.Generator | None) -> torch.Tensor:
    """(num_rows,) float32 in [0, 1): one per row, from the row's generator or the global one.

    `global_generator` None means torch's default CPU generator (`torch.manual_seed`).
    Speculative steps draw several per row by the same rule (`shared.spec_decode.draws`).
    """
    uniforms = torch.empty(len(generators))
    unseeded_rows = [index for index, generator in enumerate(generators) if generator is None]
    if unseeded_rows:
        uniforms[unseeded_rows] = torch.rand(len(unseeded_rows), generator=global_generator)
    for index, generator in enumerate(generators):
        if generator is not None:
            uniforms[index] = torch.rand(1, generator=generator)[0]
    return uniforms


def draw_tokens(candidates: Candidates, uniforms: torch.Tensor) -> torch.Tensor:
    """(num_rows,) int64 token ids: the first token, in id order, whose cumulative probability
    exceeds the row's uniform. Tokens masked to -inf are never picked."""
    logits, token_ids = _in_token_id_order(candidates)
    weights = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
    cumulative = weights.cumsum(dim=-1)
    totals = cumulative[:, -1:]
    below_total = torch.nextafter(totals, torch.zeros_like(totals))
    targets = torch.minimum(uniforms.to(logits.device)[:, None] * totals, below_total)
    positions = torch.searchsorted(cumulative, targets, right=True)
    if token_ids is None:
        return positions.squeeze(1)
    return token_ids.gather(1, positions).squeeze(1)


def _in_token_id_order(candidates: Candidates) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The candidates' columns re-ordered by token id, masked columns moved to the end."""
    if candidates.token_ids is None:
        return candidates.logits, None
    keys = candidates.token_ids.masked_fill(candidates.logits == float("-inf"), _NO_TOKEN)
    order = keys.argsort(dim=-1)
    return candidates.logits.gather(1, order), candidates.token_ids.gather(1, order)
