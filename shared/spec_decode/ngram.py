"""N-gram prompt lookup: propose the tokens that followed the sequence's suffix earlier on.

No model: for n from `max_n` down to `min_n`, the last n tokens are looked up earlier in the
prompt + output; at the most recent earlier occurrence of the longest matching suffix, the
(up to k) tokens that followed it are proposed. Useful when the output repeats or edits text
that is already in the context. The proposal is deterministic: a point mass for the
rejection sampler.
"""

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def find_ngram_proposal(token_ids: Sequence[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to `num_tokens` tokens following the most recent earlier occurrence of the longest
    suffix n-gram (n in [min_n, max_n]) of `token_ids`; [] when no suffix recurs."""
    length = len(token_ids)
    if num_tokens <= 0 or length < min_n + 1:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        # Windows starting at 0 .. length - n - 1: every earlier n-gram with a token after it.
        windows = sliding_window_view(tokens[:length - 1], n)
        matches = np.flatnonzero((windows == suffix).all(axis=1))
        if matches.size:
            start = int(matches[-1]) + n
            return tokens[start:start + num_tokens].tolist()
    return []

