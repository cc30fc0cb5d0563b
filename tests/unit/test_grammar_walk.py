"""The grammar walk the guided e2e tests use can fail: any tokenization of an allowed text
passes, a forbidden step anywhere (the first token included) or an unfinished grammar does not.
Hand-made vocabulary (tests/unit/guided_vocab.py)."""

import pytest

from shared.guided import GuidedDecodingParams
from tests.helpers.grammar_walk import assert_grammar_allows
from tests.unit.guided_vocab import EOS_TOKEN_ID, VOCAB_SIZE, tiny_grammar_cache, token_ids_of


@pytest.fixture(scope="module")
def yes_or_no():
    return tiny_grammar_cache().compile(GuidedDecodingParams(choice=["yes", "no"]))


@pytest.mark.parametrize("pieces", [("ye", "s"), ("y", "e", "s"), ("yes",), ("n", "o")])
def test_every_tokenization_of_a_choice_is_allowed(yes_or_no, pieces):
    assert_grammar_allows(yes_or_no, VOCAB_SIZE, token_ids_of(*pieces) + [EOS_TOKEN_ID])


@pytest.mark.parametrize("token_ids,position", [
    (token_ids_of("n", "e") + [EOS_TOKEN_ID], 1),
    (token_ids_of("maybe") + [EOS_TOKEN_ID], 0),
    ([EOS_TOKEN_ID], 0),
    (token_ids_of("no") + [EOS_TOKEN_ID, EOS_TOKEN_ID], 2),
])
def test_a_forbidden_step_fails_naming_its_position(yes_or_no, token_ids, position):
    with pytest.raises(AssertionError, match=f"at position {position}"):
        assert_grammar_allows(yes_or_no, VOCAB_SIZE, token_ids)


def test_an_unfinished_grammar_fails_unless_allowed(yes_or_no):
    with pytest.raises(AssertionError, match="unfinished"):
        assert_grammar_allows(yes_or_no, VOCAB_SIZE, token_ids_of("ye"))
    assert_grammar_allows(yes_or_no, VOCAB_SIZE, token_ids_of("ye"), complete=False)
