"""The batched sampler on hand-made logits: masks, penalties, min_tokens, seeds, distributions,
logprobs."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from shared.sampling import SamplingParams
from shared.sampling import candidates as candidates_module
from shared.sampling import logits_masks
from shared.sampling.candidates import (
    apply_top_p_and_min_p, compact_top_k_candidates, full_vocab_candidates)
from shared.sampling.penalties import apply_penalties
from shared.sampling.sampler import Sampler, SamplerOutput, SamplingRow, make_generator

NEG_INF = float("-inf")


def make_row(prompt=(), output=(), generator=None, stop_and_eos=(), **params) -> SamplingRow:
    return SamplingRow(params=SamplingParams(**params), prompt_token_ids=list(prompt),
                       output_token_ids=list(output), generator=generator,
                       stop_and_eos_token_ids=list(stop_and_eos))


def log_probs(*probs: float) -> list[float]:
    return [math.log(p) for p in probs]


def surviving_ids(logits: list[list[float]], **params) -> list[int]:
    """Ids that top-k/top-p/min-p leave to one row, via the path the sampler would take."""
    params_list = [SamplingParams(**params)]
    tensor = torch.tensor(logits)
    if candidates_module.is_compactable(params_list[0], tensor.shape[1]):
        candidates = compact_top_k_candidates(tensor, params_list)
    else:
        candidates = full_vocab_candidates(tensor, params_list)
    apply_top_p_and_min_p(candidates, params_list)
    is_alive = candidates.logits[0] > NEG_INF
    ids = (candidates.token_ids[0] if candidates.token_ids is not None
           else torch.arange(tensor.shape[1]))
    return sorted(ids[is_alive].tolist())


# --- greedy ---------------------------------------------------------------------------------

def test_greedy_rows_take_the_argmax_lowest_id_on_ties():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.5], [3.0, 0.0, 3.0, 0.0]])
    output = Sampler()(logits, [make_row(temperature=0.0), make_row(temperature=0.0)])
    assert output == SamplerOutput(sampled_token_ids=[1, 0])


def test_greedy_and_sampled_rows_mix_and_input_logits_are_not_modified():
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 0.0, 50.0], [4.0, 0.0, 0.0]])
    before = logits.clone()
    rows = [make_row(temperature=0.0, repetition_penalty=2.0, prompt=[1]),
            make_row(temperature=1.0, top_k=2, top_p=0.9, min_p=0.1),
            make_row(temperature=0.0, min_tokens=3, stop_and_eos=[0])]
    output = Sampler(make_generator(0))(logits, rows)
    assert output.sampled_token_ids == [1, 2, 1]
    assert torch.equal(logits, before)


def test_bad_logits_shape_is_a_programming_error():
    with pytest.raises(ValueError, match="num_rows=2"):
        Sampler()(torch.zeros(3, 4), [make_row(), make_row()])


# --- min_tokens -----------------------------------------------------------------------------

def test_min_tokens_suppresses_eos_and_stop_ids_until_reached():
    logits = torch.tensor([[0.0, 1.0, 9.0, 8.0]])  # 2 = EOS, 3 = a stop token id, 1 next best
    sampler = Sampler()

    def pick(num_generated: int) -> int:
        row = make_row(temperature=0.0, min_tokens=2, output=[1] * num_generated,
                       stop_and_eos=[2, 3])
        return sampler(logits, [row]).sampled_token_ids[0]

    assert [pick(0), pick(1), pick(2), pick(3)] == [1, 1, 2, 2]


# --- penalties ------------------------------------------------------------------------------

def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5], [2.0, -2.0, 1.0, 0.5]])
    rows = [make_row(prompt=[0, 0], output=[1], repetition_penalty=2.0), make_row()]
    apply_penalties(logits, rows, [0])
    assert logits.tolist() == [[1.0, -4.0, 1.0, 0.5], [2.0, -2.0, 1.0, 0.5]]


def test_presence_and_frequency_penalties_count_output_tokens_only():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    rows = [make_row(prompt=[3], output=[1, 1, 2], presence_penalty=0.5, frequency_penalty=0.25)]
    apply_penalties(logits, rows, [0])
    # token 1: -2 - (0.5 + 2 * 0.25); token 2: 1 - (0.5 + 0.25); prompt token 3 untouched
    assert logits.tolist() == [[2.0, -3.0, 0.25, 0.5]]


def test_repetition_penalty_comes_before_additive_penalties():
    logits = torch.tensor([[4.0, -1.0, 0.0]])
    rows = [make_row(output=[0, 0], repetition_penalty=2.0, frequency_penalty=1.0,
                     presence_penalty=-0.5)]
    apply_penalties(logits, rows, [0])
    assert logits.tolist() == [[4.0 / 2.0 - (2 * 1.0 - 0.5), -1.0, 0.0]]


def test_penalties_change_the_greedy_choice():
    logits = torch.tensor([[3.0, 2.0, 0.0]])
    row = make_row(temperature=0.0, output=[0], frequency_penalty=1.5)
    assert Sampler()(logits, [row]).sampled_token_ids == [1]


# --- top-k / top-p / min-p masks ------------------------------------------------------------

@pytest.mark.parametrize("top_k, survivors", [
    (1, [1]), (2, [1, 3]), (3, [1, 3, 5]), (5, [1, 2, 3, 4, 5]), (6, [0, 1, 2, 3, 4, 5]),
    (0, [0, 1, 2, 3, 4, 5]), (-1, [0, 1, 2, 3, 4, 5])])
def test_top_k_keeps_the_k_largest_logits(top_k, survivors):
    assert surviving_ids([[1.0, 6.0, 3.0, 5.0, 2.0, 4.0]], top_k=top_k) == survivors


def test_top_k_keeps_every_token_tied_with_the_kth_logit():
    assert surviving_ids([[3.0, 1.0, 2.0, 2.0, 0.0]], top_k=2) == [0, 2, 3]
    assert surviving_ids([[1.0, 1.0, 1.0, 1.0]], top_k=1) == [0, 1, 2, 3]


def test_top_k_too_large_to_compact_masks_the_whole_vocab_row(monkeypatch):
    monkeypatch.setattr(candidates_module, "MAX_COMPACT_TOP_K", 2)
    assert surviving_ids([[1.0, 6.0, 3.0, 5.0, 2.0, 4.0]], top_k=3) == [1, 3, 5]


@pytest.mark.parametrize("top_p, survivors", [
    (0.35, [0]), (0.69, [0, 1]), (0.71, [0, 1, 2]), (0.95, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3])])
def test_top_p_keeps_the_smallest_set_reaching_top_p(top_p, survivors):
    assert surviving_ids([log_probs(0.4, 0.3, 0.2, 0.1)], top_p=top_p) == survivors


def test_top_p_always_keeps_the_most_likely_token():
    assert surviving_ids([log_probs(0.9, 0.05, 0.05)], top_p=0.01) == [0]


def test_top_p_keeps_tokens_tied_with_the_last_kept_one():
    assert surviving_ids([[0.0, 0.0, 0.0, 0.0]], top_p=0.5) == [0, 1, 2, 3]


def test_top_p_applies_to_the_top_k_renormalised_distribution():
    logits = [log_probs(0.1, 0.4, 0.2, 0.3)]
    assert surviving_ids(logits, top_p=0.5) == [1, 3]
    assert surviving_ids(logits, top_k=2, top_p=0.5) == [1]  # 0.4 / 0.7 > 0.5


def test_top_p_sees_the_temperature_scaled_distribution():
    logits = [[2.0, 1.0, 0.0]]
    assert surviving_ids(logits, temperature=10.0, top_p=0.6) == [0, 1]
    assert surviving_ids(logits, temperature=0.1, top_p=0.6) == [0]


def test_top_p_sorted_prefix_search_matches_a_full_sort(monkeypatch):
    monkeypatch.setattr(logits_masks, "TOP_P_PREFIX_WIDTHS", (2, 5))
    logits = torch.randn(40, 12, generator=make_generator(3)) * 2
    top_ps = torch.linspace(0.05, 0.99, 40)[:, None]
    expected = logits_masks.top_p_thresholds_sorted(
        logits.sort(dim=-1, descending=True).values, top_ps,
        torch.exp(logits - logits.max(dim=-1, keepdim=True).values).sum(-1, keepdim=True))
    assert torch.equal(logits_masks.top_p_thresholds(logits, top_ps), expected)


@pytest.mark.parametrize("min_p, survivors", [
    (0.0, [0, 1, 2, 3]), (0.1, [0, 1, 2, 3]), (0.25, [0, 1, 2]), (0.45, [0, 1]), (0.6, [0]),
    (1.0, [0])])
def test_min_p_keeps_tokens_at_least_min_p_times_the_top_probability(min_p, survivors):
    assert surviving_ids([log_probs(0.5, 0.25, 0.15, 0.1)], min_p=min_p) == survivors


def test_min_p_applies_after_top_k_and_top_p():
    logits = [log_probs(0.5, 0.25, 0.15, 0.1)]
    assert surviving_ids(logits, top_k=3, top_p=0.7, min_p=0.45) == [0, 1]
    # min-p first would leave {0, 1, 2} renormalised and top-p 0.8 would then drop token 2
    assert surviving_ids(logits, top_p=0.8, min_p=0.25) == [0, 1, 2]


def test_masked_tokens_are_never_sampled():
    logits = torch.tensor([[1.0, 6.0, 3.0, 5.0, 2.0, 4.0]] * 200)
    rows = [make_row(temperature=5.0, top_k=3) for _ in range(200)]
    sampled = Sampler(make_generator(1))(logits, rows).sampled_token_ids
    assert set(sampled) == {1, 3, 5}


# --- seeds ----------------------------------------------------------------------------------

def run_steps(seeded_row_position: int, neighbours: list[dict], num_steps: int = 30) -> list[int]:
    """Tokens a seed-7 row draws over `num_steps` calls, sharing each batch with `neighbours`."""
    logits_row = torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5, -0.4])
    generator = make_generator(7)
    sampler = Sampler()
    tokens = []
    for _ in range(num_steps):
        rows = [make_row(**params) for params in neighbours]
        rows.insert(seeded_row_position,
                    make_row(generator=generator, seed=7, temperature=0.9, top_p=0.95))
        logits = torch.randn(len(rows), 6)
        logits[seeded_row_position] = logits_row
        tokens.append(sampler(logits, rows).sampled_token_ids[seeded_row_position])
    return tokens


def test_a_seeded_row_draws_the_same_tokens_whatever_shares_the_batch():
    alone = run_steps(0, [])
    neighbours = [{"temperature": 1.0}, {"temperature": 0.5, "top_k": 3},
                  {"temperature": 0.0}, {"temperature": 1.2, "top_p": 0.5},
                  {"seed": 1, "generator": make_generator(1), "repetition_penalty": 1.3,
                   "output": [1]}]
    assert run_steps(2, neighbours) == alone
    assert run_steps(4, list(reversed(neighbours))) == alone
    assert len(set(alone)) > 1


def test_a_seeded_row_gives_the_same_tokens_compacted_or_not(monkeypatch):
    logits = torch.tensor([[0.3, -0.2, 0.1, 0.0, 0.5, -0.4]])

    def draws(top_k: int) -> list[int]:
        generator = make_generator(11)
        return [Sampler()(logits, [make_row(generator=generator, top_k=top_k)])
                .sampled_token_ids[0] for _ in range(30)]

    compacted = draws(top_k=4)
    assert compacted != draws(top_k=0)
    monkeypatch.setattr(candidates_module, "MAX_COMPACT_TOP_K", 0)
    assert draws(top_k=4) == compacted


def test_different_seeds_draw_different_tokens():
    logits = torch.zeros(1, 6)

    def draws(seed: int) -> list[int]:
        generator = make_generator(seed)
        return [Sampler()(logits, [make_row(generator=generator)]).sampled_token_ids[0]
                for _ in range(20)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)


def test_unseeded_rows_follow_the_global_generator():
    logits = torch.zeros(10, 6)
    rows = [make_row() for _ in range(10)]
    first = Sampler(make_generator(5))(logits, rows).sampled_token_ids
    assert Sampler(make_generator(5))(logits, rows).sampled_token_ids == first
    torch.manual_seed(5)
    from_default = Sampler()(logits, rows).sampled_token_ids
    torch.manual_seed(5)
    assert Sampler()(logits, rows).sampled_token_ids == from_default


# --- sampled frequencies follow the distribution (chi-square) ------------------------------

NUM_DRAWS = 20_000
CHI_LOGITS = [1.0, 0.5, 0.0, -0.5, 2.0, 0.2]


def draw_counts(**params) -> np.ndarray:
    logits = torch.tensor([CHI_LOGITS] * NUM_DRAWS)
    rows = [make_row(**params)] * NUM_DRAWS
    sampled = Sampler(make_generator(1234))(logits, rows).sampled_token_ids
    return np.bincount(sampled, minlength=len(CHI_LOGITS))


def expected_probs(temperature: float, kept_ids: list[int]) -> np.ndarray:
    weights = np.exp(np.array(CHI_LOGITS, dtype=np.float64) / temperature)
    weights[[i for i in range(len(CHI_LOGITS)) if i not in kept_ids]] = 0.0
    return weights / weights.sum()


def assert_follows(counts: np.ndarray, probs: np.ndarray) -> None:
    support = probs > 0
    assert counts[~support].sum() == 0
    assert chisquare(counts[support], probs[support] * NUM_DRAWS).pvalue > 0.001


def test_temperature_sampling_follows_softmax_of_scaled_logits():
    assert_follows(draw_counts(temperature=0.7), expected_probs(0.7, list(range(6))))


def test_top_k_sampling_follows_the_renormalised_top_k():
    assert_follows(draw_counts(temperature=1.3, top_k=3), expected_probs(1.3, [0, 1, 4]))


def test_top_p_sampling_follows_the_renormalised_nucleus():
    # probs at T=1: 4:.507 0:.186 1:.113 5:.084 2:.069 3:.042 -> 0.85 needs {4, 0, 1, 5}
    probs = expected_probs(1.0, list(range(6)))
    assert probs[4] + probs[0] + probs[1] < 0.85 < probs[4] + probs[0] + probs[1] + probs[5]
    assert_follows(draw_counts(temperature=1.0, top_p=0.85), expected_probs(1.0, [0, 1, 4, 5]))


# --- logprobs -------------------------------------------------------------------------------

def test_logprobs_are_raw_log_softmax_and_top_n_is_sorted():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 1.0, 0.0, 0.0], [5.0, 0.0, 0.0, 1.0]])
    rows = [make_row(temperature=0.0, logprobs=2), make_row(temperature=0.0),
            make_row(temperature=0.0, logprobs=0, repetition_penalty=2.0, prompt=[0])]
    output = Sampler()(logits, rows)
    raw = torch.log_softmax(logits, dim=-1)
    assert output.sampled_token_ids == [1, 1, 0]
    assert output.sampled_logprobs == [raw[0, 1].item(), raw[1, 1].item(), raw[2, 0].item()]
    assert output.top_logprobs == [[(1, raw[0, 1].item()), (2, raw[0, 2].item())], [], []]
    assert output.sampled_logprobs[0] == pytest.approx(
        3.0 - math.log(math.exp(1) + math.exp(3) + math.exp(2) + 1), abs=1e-6)


def test_logprobs_ignore_temperature_and_cover_unsorted_top_n():
    logits = torch.tensor([[0.0, -1.0, 4.0, 2.0, 3.0]])
    output = Sampler(make_generator(0))(logits, [make_row(temperature=0.5, logprobs=3)])
    raw = torch.log_softmax(logits, dim=-1)[0]
    assert [token for token, _ in output.top_logprobs[0]] == [2, 4, 3]
    assert [value for _, value in output.top_logprobs[0]] == [raw[2].item(), raw[4].item(),
                                                              raw[3].item()]
    token = output.sampled_token_ids[0]
    assert output.sampled_logprobs == [raw[token].item()]


def test_no_logprobs_when_no_row_asks():
    output = Sampler()(torch.zeros(2, 3), [make_row(temperature=0.0)] * 2)
    assert output.sampled_logprobs is None and output.top_logprobs is None
