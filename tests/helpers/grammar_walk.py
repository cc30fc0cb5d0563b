"""Whether a token sequence is one the grammar allowed, step by step.

`assert_grammar_allows` walks a fresh XGrammar matcher along the tokens: at each step the
token must be allowed by the bitmask the engine would mask the logits with, and the matcher
must accept it. Output that decodes to a valid text can still hold a forbidden step (a grammar
applied to the wrong row, a matcher that missed the first token), and this finds it.
"""

from collections.abc import Sequence

import xgrammar as xgr

from shared.guided.bitmask import allowed_token_ids, fill_bitmask


def assert_grammar_allows(compiled: xgr.CompiledGrammar, vocab_size: int, token_ids: Sequence[int],
                          complete: bool = True) -> None:
    """Every token was allowed when it was chosen; with `complete`, the grammar ended (its last
    token a stop token the grammar allowed)."""
    matcher = xgr.GrammarMatcher(compiled)
    for position, token_id in enumerate(token_ids):
        assert not matcher.is_terminated(), f"token {token_id} at position {position} follows the grammar's end"
        bitmask, _ = fill_bitmask([matcher], vocab_size)
        allowed = allowed_token_ids(bitmask[0], vocab_size)
        assert token_id in allowed, (f"token {token_id} at position {position} is forbidden by the grammar "
                                     f"(it allows {len(allowed)} tokens there, e.g. {allowed[:8]})")
        assert matcher.accept_token(token_id), f"the matcher refuses token {token_id} at position {position}"
    if complete:
        assert matcher.is_terminated(), f"the grammar is unfinished after {list(token_ids)}"
