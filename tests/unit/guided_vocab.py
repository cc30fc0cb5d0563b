"""A hand-made 256-token vocabulary for guided-decoding unit tests, matching the tiny Llama.

Ids 0-2 are special (2 is the tiny model's EOS), 3-97 are the printable ASCII characters,
98-197 the two-digit strings "00".."99", the rest a few words and JSON pieces. Tests compute
the tokens a grammar must allow from this list by brute force and compare with the bitmask.
"""

import xgrammar as xgr

from shared.guided.compiler import GrammarCache

EOS_TOKEN_ID = 2
_WORDS = ["yes", "no", "maybe", "ye", "true", "false", "null", "ab", "abc", '{"', '":', '"}',
          ', "', "2024", ".com", "hello", "world", " the"]
VOCAB = (["", "", ""] + [chr(code) for code in range(32, 127)]
         + [f"{number:02d}" for number in range(100)] + _WORDS)
VOCAB += [f"<unused{index}>" for index in range(256 - len(VOCAB))]
VOCAB_SIZE = len(VOCAB)
assert VOCAB_SIZE == 256


def tiny_grammar_cache(max_entries: int = 256) -> GrammarCache:
    info = xgr.TokenizerInfo(VOCAB, vocab_type=xgr.VocabType.RAW, vocab_size=VOCAB_SIZE,
                             stop_token_ids=[EOS_TOKEN_ID])
    return GrammarCache(info, max_entries=max_entries, num_threads=1)


def decode(token_ids: list[int]) -> str:
    """The text of the tokens, EOS left out."""
    return "".join(VOCAB[token_id] for token_id in token_ids if token_id != EOS_TOKEN_ID)


def token_ids_of(*pieces: str) -> list[int]:
    return [VOCAB.index(piece) for piece in pieces]
