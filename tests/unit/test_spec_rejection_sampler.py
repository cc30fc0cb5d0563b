"""The rejection sampler: what it emits follows the target distribution, whatever the draft.

Statistical tests draw tens of thousands of times with fixed seeds (so they cannot flake) and
compare the emitted tokens' histogram with the target distribution by a chi-square test; a
deliberately wrong sampler (always accepting the draft) must fail the same test.
"""

import pytest
import torch
from scipy.stats import chisquare

from shared.sampling.params import SamplingParams
from shared.sampling.sampler import SamplingRow
from shared.spec_decode import rejection_sampler
from shared.spec_decode.probs import processed_probs
from shared.spec_decode.rejection_sampler import rejection_sample

VOCAB = 12
NUM_DRAWS = 40_000
MIN_P_VALUE = 1e-3
TARGET = torch.tensor([0.02, 0.20, 0.05, 0.13, 0.01, 0.09, 0.15, 0.04, 0.11, 0.06, 0.08, 0.06])
# Deliberately bad: most mass where the target has little.
BAD_DRAFT = torch.tensor([0.30, 0.01, 0.02, 0.01, 0.25, 0.05, 0.01, 0.20, 0.02, 0.05, 0.03, 0.05])


def draw_from(probs: torch.Tensor, num: int, seed: int) -> torch.Tensor:
    return torch.multinomial(probs, num, replacement=True, generator=torch.Generator().manual_seed(seed))


def chi_square_p_value(token_ids: torch.Tensor, expected_probs: torch.Tensor) -> float:
    counts = torch.bincount(token_ids, minlength=len(expected_probs)).double()
    is_possible = expected_probs > 0
    assert counts[~is_possible].sum() == 0, "a token of zero target probability was emitted"
    possible_probs = expected_probs[is_possible].double()
    expected = possible_probs * counts.sum() / possible_probs.sum()
    return float(chisquare(counts[is_possible].numpy(), expected.numpy()).pvalue)


def first_tokens_with_draft(target: torch.Tensor, draft: torch.Tensor | None, draft_ids: torch.Tensor,
                            seed: int = 0) -> torch.Tensor:
    """One draft token per row (K = 1): the first emitted token of each of NUM_DRAWS rows."""
    num = draft_ids.shape[0]
    target_probs = target.expand(num, 2, VOCAB)
    draft_probs = None if draft is None else draft.expand(num, 1, VOCAB)
    uniforms = torch.rand(num, 2, generator=torch.Generator().manual_seed(1000 + seed))
    output = rejection_sample(target_probs, draft_ids[:, None], draft_probs, torch.ones(num, dtype=torch.long),
                              uniforms)
    return output.token_ids[:, 0]


def test_emitted_tokens_follow_the_target_with_a_bad_draft_distribution():
    draft_ids = draw_from(BAD_DRAFT, NUM_DRAWS, seed=1)
    tokens = first_tokens_with_draft(TARGET, BAD_DRAFT, draft_ids)
    assert chi_square_p_value(tokens, TARGET) > MIN_P_VALUE


def test_emitted_tokens_follow_the_target_with_a_point_mass_draft():
    """N-gram proposals: always token 4, which the target rarely picks (q(x) = 1)."""
    draft_ids = torch.full((NUM_DRAWS,), 4)
    tokens = first_tokens_with_draft(TARGET, None, draft_ids)
    assert chi_square_p_value(tokens, TARGET) > MIN_P_VALUE


def test_always_accepting_fails_the_same_test(monkeypatch):
    monkeypatch.setattr(rejection_sampler, "acceptance_probabilities",
                        lambda target, ids, draft: torch.ones(ids.shape))
    draft_ids = draw_from(BAD_DRAFT, NUM_DRAWS, seed=1)
    tokens = first_tokens_with_draft(TARGET, BAD_DRAFT, draft_ids)
    assert chi_square_p_value(tokens, BAD_DRAFT) > MIN_P_VALUE  # it just returns the draft
    assert chi_square_p_value(tokens, TARGET) < MIN_P_VALUE


def test_resampling_from_the_target_instead_of_the_residual_fails_the_test(monkeypatch):
    """Rejected positions must draw from norm(max(0, p - q)), not from p."""
    monkeypatch.setattr(rejection_sampler, "_final_distribution",
                        lambda target, ids, draft, accepted, drafts: target[torch.arange(len(ids)), accepted])
    draft_ids = draw_from(BAD_DRAFT, NUM_DRAWS, seed=1)
    tokens = first_tokens_with_draft(TARGET, BAD_DRAFT, draft_ids)
    assert chi_square_p_value(tokens, TARGET) < MIN_P_VALUE


def test_second_position_and_bonus_follow_their_targets():
    """K = 2 with a different target per position: given an accepted first draft, the second
    emitted token follows p_2; after two accepted drafts the bonus token follows p_3."""
    second_target = TARGET.flip(0)
    bonus_target = torch.softmax(torch.arange(VOCAB, dtype=torch.float32) / 3, dim=0)
    target_probs = torch.stack([TARGET, second_target, bonus_target]).expand(NUM_DRAWS, 3, VOCAB)
    draft = torch.stack([BAD_DRAFT, BAD_DRAFT]).expand(NUM_DRAWS, 2, VOCAB)
    draft_ids = torch.stack([draw_from(BAD_DRAFT, NUM_DRAWS, seed=2), draw_from(BAD_DRAFT, NUM_DRAWS, seed=3)], 1)
    uniforms = torch.rand(NUM_DRAWS, 3, generator=torch.Generator().manual_seed(4))
    output = rejection_sample(target_probs, draft_ids, draft, torch.full((NUM_DRAWS,), 2), uniforms)
    second = output.token_ids[output.num_accepted >= 1, 1]
    assert chi_square_p_value(second, second_target) > MIN_P_VALUE
    bonus = output.token_ids[output.num_accepted == 2, 2]
    assert len(bonus) > 1000
    assert chi_square_p_value(bonus, bonus_target) > MIN_P_VALUE


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.6),
    SamplingParams(temperature=1.0, top_k=8, top_p=0.9, min_p=0.05),
])
def test_processed_target_is_followed_with_top_k_and_top_p(params):
    """p and q both come from `processed_probs` (what the speculator uses); the expected
    distribution is computed here by hand from the sorted logits."""
    logits = torch.tensor([1.2, -0.3, 2.5, 0.1, 1.9, -1.0, 0.7, 2.2, -0.5, 0.4, 1.5, 0.0])
    draft_logits = logits.flip(0) * 1.5
    row = SamplingRow(params, prompt_token_ids=[1], output_token_ids=[], generator=None)
    target = processed_probs(logits[None], [row])[0]
    assert torch.allclose(target, expected_processed(logits, params), atol=1e-6)
    draft = processed_probs(draft_logits[None], [row])[0]
    draft_ids = draw_from(draft, NUM_DRAWS, seed=5)
    tokens = first_tokens_with_draft(target, draft, draft_ids, seed=6)
    assert chi_square_p_value(tokens, target) > MIN_P_VALUE


def expected_processed(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Top-k on the logits, temperature, top-p over the most likely first, then min-p."""
    order = logits.argsort(descending=True)
    keep = torch.zeros(len(logits), dtype=torch.bool)
    keep[order[:params.top_k or len(logits)]] = True
    probs = torch.softmax((logits / params.temperature).masked_fill(~keep, float("-inf")), dim=0)
    mass_before = 0.0
    for token in order.tolist():
        if mass_before >= params.top_p:
            keep[token] = False
        mass_before += float(probs[token])
    probs = torch.softmax((logits / params.temperature).masked_fill(~keep, float("-inf")), dim=0)
    keep &= probs >= params.min_p * probs.max()
    return torch.softmax((logits / params.temperature).masked_fill(~keep, float("-inf")), dim=0)


def test_point_mass_target_accepts_only_its_token_and_recovers_it():
    """A greedy-like p: the draft token is accepted iff it is p's token, else p's token comes."""
    target = torch.zeros(2, 3, VOCAB)
    target[:, 0, 3] = target[:, 1, 7] = target[:, 2, 9] = 1.0
    draft_ids = torch.tensor([[3, 7], [3, 5]])
    output = rejection_sample(target, draft_ids, None, torch.tensor([2, 2]), torch.full((2, 3), 0.99))
    assert output.token_ids.tolist() == [[3, 7, 9], [3, 7, -1]]
    assert output.num_accepted.tolist() == [2, 1]


def test_rows_with_fewer_drafts_stop_at_their_own_length():
    target = torch.zeros(2, 3, VOCAB)
    target[:, :, 6] = 1.0
    output = rejection_sample(target, torch.tensor([[6, 6], [6, 0]]), None, torch.tensor([2, 1]),
                              torch.zeros(2, 3))
    assert output.token_ids.tolist() == [[6, 6, 6], [6, 6, -1]]
    assert output.num_accepted.tolist() == [2, 1]
