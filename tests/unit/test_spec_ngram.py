"""N-gram prompt lookup: the tokens after the most recent earlier occurrence of the longest
recurring suffix."""

import pytest

from shared.spec_decode.ngram import find_ngram_proposal


@pytest.mark.parametrize("tokens, num, expected", [
    # Suffix [7, 8] occurred at the start: propose what followed it.
    ([7, 8, 9, 10, 11, 5, 7, 8], 3, [9, 10, 11]),
    # Fewer tokens follow than asked for: as many as there are.
    ([7, 8, 9, 7, 8], 5, [9, 7, 8]),
    # The longest suffix wins over a more recent shorter one: [1, 2, 3] -> 40, not [3] -> 50.
    ([1, 2, 3, 40, 9, 3, 50, 1, 2, 3], 1, [40]),
    # Among equal lengths the most recent occurrence wins.
    ([5, 6, 1, 5, 6, 2, 5, 6], 1, [2]),
    # A run of one token: the longest suffix [4, 4, 4] last began at 0, one token follows.
    ([4, 4, 4, 4], 2, [4]),
    # Nothing recurs.
    ([1, 2, 3, 4], 3, []),
    ([9], 3, []),
])
def test_proposals(tokens, num, expected):
    assert find_ngram_proposal(tokens, num, min_n=1, max_n=3) == expected


def test_suffixes_shorter_than_min_n_are_not_looked_up():
    assert find_ngram_proposal([5, 6, 1, 2, 6], 2, min_n=2, max_n=3) == []
    assert find_ngram_proposal([5, 6, 1, 2, 6], 2, min_n=1, max_n=3) == [1, 2]


def test_no_tokens_asked_no_tokens_proposed():
    assert find_ngram_proposal([4, 4, 4], 0, min_n=1, max_n=3) == []
