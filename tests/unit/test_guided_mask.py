"""Token bitmasks: exactly the tokens a grammar allows next, applied to constrained rows only.

Expected sets are computed by brute force over the hand-made vocabulary (tests/unit/guided_vocab.py).
"""

import pytest
import torch
import xgrammar as xgr

from shared.guided import GuidedDecodingParams
from shared.guided.bitmask import allowed_token_ids, allows_only, apply_token_bitmasks, fill_bitmask
from shared.sampling import SamplingParams
from shared.sampling.sampler import Sampler, SamplingRow, make_generator
from tests.unit.guided_vocab import EOS_TOKEN_ID, VOCAB, VOCAB_SIZE, tiny_grammar_cache, token_ids_of


def prefixes_of(*texts: str) -> list[int]:
    """Ids of the non-empty tokens that begin one of `texts`."""
    return [i for i, piece in enumerate(VOCAB) if piece and any(text.startswith(piece) for text in texts)]


def allowed_after(guided: GuidedDecodingParams, accepted: list[int]) -> list[int]:
    matcher = xgr.GrammarMatcher(tiny_grammar_cache().compile(guided))
    for token_id in accepted:
        assert matcher.accept_token(token_id)
    bitmask, _ = fill_bitmask([matcher], VOCAB_SIZE)
    return allowed_token_ids(bitmask[0], VOCAB_SIZE)


CHOICE = GuidedDecodingParams(choice=["yes", "no", "maybe"])
TWO_DIGITS = GuidedDecodingParams(regex="[0-9]{2}")
DIGITS = [VOCAB.index(str(digit)) for digit in range(10)]
PAIRS = [VOCAB.index(f"{number:02d}") for number in range(100)]


@pytest.mark.parametrize("guided, accepted, expected", [
    (CHOICE, [], prefixes_of("yes", "no", "maybe")),
    (CHOICE, token_ids_of("ye"), token_ids_of("s")),
    (CHOICE, token_ids_of("m", "a"), token_ids_of("y")),
    (CHOICE, token_ids_of("yes"), [EOS_TOKEN_ID]),
    (TWO_DIGITS, [], sorted(DIGITS + PAIRS)),
    (TWO_DIGITS, token_ids_of("7"), DIGITS),
    (TWO_DIGITS, token_ids_of("42"), [EOS_TOKEN_ID]),
    (GuidedDecodingParams(json_schema={"type": "boolean"}), [], prefixes_of("true", "false")),
    (GuidedDecodingParams(json_object=True), [], token_ids_of("{", '{"')),
    (GuidedDecodingParams(grammar='root ::= "a" [bc]'), token_ids_of("a"), token_ids_of("b", "c")),
])
def test_bitmask_allows_exactly_the_grammars_next_tokens(guided, accepted, expected):
    assert allowed_after(guided, accepted) == sorted(expected)


def test_fill_gives_each_matcher_one_int32_row_of_vocab_over_32_words():
    compiled = tiny_grammar_cache().compile(TWO_DIGITS)
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(2)]
    assert matchers[1].accept_token(VOCAB.index("7"))
    bitmask, restricts = fill_bitmask(matchers, VOCAB_SIZE)
    assert bitmask.shape == (2, 8) and bitmask.dtype == torch.int32
    assert restricts == [True, True]
    assert allowed_token_ids(bitmask[0], VOCAB_SIZE) == sorted(DIGITS + PAIRS)
    assert allowed_token_ids(bitmask[1], VOCAB_SIZE) == DIGITS


def test_apply_masks_forbidden_tokens_of_constrained_rows_only():
    logits = torch.randn(3, VOCAB_SIZE, generator=torch.Generator().manual_seed(0))
    original = logits.clone()
    row_a = torch.zeros(8, dtype=torch.int32)
    row_a[0] = 0b1010  # tokens 1 and 3
    row_c = torch.full((8,), -1, dtype=torch.int32)
    row_c[7] = 0  # everything but tokens 224..255
    apply_token_bitmasks(logits, [row_a, row_c], [0, 2])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [1, 3]
    assert torch.equal(logits[0, [1, 3]], original[0, [1, 3]])
    assert torch.equal(logits[1], original[1])
    assert torch.isfinite(logits[2]).nonzero().flatten().tolist() == list(range(224))
    assert torch.equal(logits[2, :224], original[2, :224])


def sampler_rows(params_list, bitmasks):
    return [SamplingRow(params, [5, 6], [], make_generator(100 + index) if params.seed is not None else None,
                        guided_bitmask=bitmask)
            for index, (params, bitmask) in enumerate(zip(params_list, bitmasks))]


def digit_only_bitmask() -> torch.Tensor:
    matcher = xgr.GrammarMatcher(tiny_grammar_cache().compile(GuidedDecodingParams(regex="[0-9]")))
    bitmask, _ = fill_bitmask([matcher], VOCAB_SIZE)
    return bitmask[0]


def test_mixed_batch_leaves_free_rows_as_an_unconstrained_run():
    logits = torch.randn(4, VOCAB_SIZE, generator=torch.Generator().manual_seed(1)) * 3
    greedy = SamplingParams(temperature=0, logprobs=2)
    sampled = SamplingParams(temperature=1.0, top_p=0.9, seed=7, logprobs=2, repetition_penalty=1.3)
    params_list = [greedy, greedy, sampled, sampled]
    mask = digit_only_bitmask()
    mixed = Sampler()(logits, sampler_rows(params_list, [None, mask, None, mask]))
    free = Sampler()(logits, sampler_rows(params_list, [None] * 4))
    for row in (0, 2):
        assert mixed.sampled_token_ids[row] == free.sampled_token_ids[row]
        assert mixed.sampled_logprobs[row] == free.sampled_logprobs[row]
        assert mixed.top_logprobs[row] == free.top_logprobs[row]
    assert mixed.sampled_token_ids[1] == DIGITS[int(logits[1, DIGITS].argmax())]
    assert mixed.sampled_token_ids[3] in DIGITS


def test_sampled_rows_draw_only_allowed_tokens():
    logits = torch.zeros(64, VOCAB_SIZE)
    logits[:, DIGITS] = -20.0  # allowed, but far less likely than everything else
    params = SamplingParams(temperature=1.5, top_k=50, seed=3)
    rows = sampler_rows([params] * 64, [digit_only_bitmask()] * 64)
    tokens = Sampler()(logits, rows).sampled_token_ids
    assert set(tokens) <= set(DIGITS) and len(set(tokens)) > 3


def test_allows_only_tells_a_complete_grammar_from_one_that_can_go_on():
    cache = tiny_grammar_cache()
    matchers = [xgr.GrammarMatcher(cache.compile(GuidedDecodingParams(regex="[0-9]{1,3}"))) for _ in range(3)]
    for matcher, digits in zip(matchers, ([], ["4"], ["4", "2", "7"])):
        for token_id in token_ids_of(*digits):
            assert matcher.accept_token(token_id)
    bitmask, _ = fill_bitmask(matchers, VOCAB_SIZE)
    assert [allows_only(row, [EOS_TOKEN_ID]) for row in bitmask] == [False, False, True]
    after_one_digit = allowed_token_ids(bitmask[1], VOCAB_SIZE)  # EOS, digits, "00".."99"
    assert len(after_one_digit) == 111 and allows_only(bitmask[1], after_one_digit)
    assert not allows_only(bitmask[1], after_one_digit[:-1])
