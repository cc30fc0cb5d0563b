"""The per-step shortcuts of greedy sampling: one pass over the logits, and no copy of them
when every logits row samples in order (benchmarks/step_overhead.py measures both)."""

import pytest
import torch

from shared.executor.model_runner import _logit_rows
from shared.sampling import SamplingParams
from shared.sampling.sampler import NoTokenAllowedError, Sampler, SamplingRow

VOCAB = 49152  # SmolLM2's: wide enough for the vectorized reduction kernels


def greedy_rows(count: int) -> list[SamplingRow]:
    return [SamplingRow(params=SamplingParams(temperature=0.0), prompt_token_ids=[], output_token_ids=[],
                        generator=None) for _ in range(count)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wide_greedy_rows_take_the_lowest_id_among_tied_maxima(dtype):
    """A bf16 model's logits are sampled as they come (no fp32 copy): the same tokens."""
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).float()
    tied = [(3, 40000), (17, 18), (VOCAB - 9, VOCAB - 1), (1000, 1016), (5, 49000), (0, VOCAB - 1)]
    for row, ids in enumerate(tied):
        logits[row, list(ids)] = 10.0
    output = Sampler()(logits.to(dtype), greedy_rows(len(tied)))
    assert output.sampled_token_ids == [min(ids) for ids in tied]


def test_bf16_logits_with_logprobs_or_penalties_are_widened_first():
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    rows = greedy_rows(2)
    rows[0].params = SamplingParams(temperature=0.0, logprobs=2)
    rows[1].params = SamplingParams(temperature=0.0, repetition_penalty=1.5)
    rows[1].output_token_ids = [int(logits[1].float().argmax())]
    output = Sampler()(logits, rows)
    expected = torch.log_softmax(logits[0].float(), dim=-1)
    assert output.sampled_logprobs[0] == pytest.approx(float(expected.max()))
    assert output.sampled_token_ids[1] != rows[1].output_token_ids[0]  # the penalty moved it


@pytest.mark.parametrize("bad_value", [float("nan"), float("-inf")])
def test_a_greedy_row_with_nothing_to_take_is_refused(bad_value):
    logits = torch.randn(3, VOCAB)
    logits[1] = float("-inf")
    logits[1, 7] = bad_value
    with pytest.raises(NoTokenAllowedError, match=r"rows \[1\]"):
        Sampler()(logits, greedy_rows(3))


def test_every_row_in_order_is_the_logits_themselves_not_a_copy():
    logits = torch.randn(4, 10)
    assert _logit_rows(logits, [0, 1, 2, 3]) is logits


@pytest.mark.parametrize("rows", [[1, 3], [3, 2, 1, 0], [0, 1, 2]])
def test_other_rows_are_gathered_in_the_order_asked(rows):
    logits = torch.randn(4, 10)
    assert torch.equal(_logit_rows(logits, rows), logits[rows])
