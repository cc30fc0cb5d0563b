"""Turning generated token ids into text deltas, one step at a time.

The engine owns one `IncrementalDetokenizer` per request: after each step it calls
`add_tokens(new_token_ids)` and streams the returned delta; when the request finishes
it calls `flush()` once and streams that too.

Technique ("prefix offset / read offset"): the text of token ids[prefix:read] has
already been emitted. Each call decodes the small window ids[prefix:] and emits what
it adds beyond the text of ids[prefix:read]. Decoding with a few tokens of left context
makes word-boundary spaces come out right (SentencePiece decoders drop the leading space
of the first token they decode; it is dropped from both texts alike), and the window
stays a handful of tokens, so the cost per step does not grow with the output length.
When the window's text ends in U+FFFD the last token ended inside a multi-byte UTF-8
character (byte-level BPE splits emoji and CJK across tokens), so nothing is emitted
and the offsets stay put until a later token completes the character. (So the window
only grows while the output keeps ending inside a character: a few tokens for real text.)
"""

from transformers import PreTrainedTokenizerBase

# Tokens of left context decoded together with the first output token.
NUM_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Streams the text of one request's output tokens without ever splitting a character.

    Contract: the concatenation of every `add_tokens` delta plus the final `flush()`
    equals `tokenizer.decode(output_token_ids, skip_special_tokens=...,
    clean_up_tokenization_spaces=False)` for byte-level BPE tokenizers such as SmolLM2's
    (whose default is no clean-up), and no delta ends in a character cut in half.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
    ):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._token_ids: list[int] = list(prompt_token_ids)
        self._num_prompt_tokens = len(prompt_token_ids)
        self._prefix_offset = max(self._num_prompt_tokens - NUM_CONTEXT_TOKENS, 0)
        self._read_offset = self._num_prompt_tokens
        self._text_parts: list[str] = []

    @property
    def text(self) -> str:
        """All output text emitted so far (held-back partial characters excluded)."""
        return "".join(self._text_parts)

    @property
    def output_token_ids(self) -> list[int]:
        """Every output token id added so far."""
        return self._token_ids[self._num_prompt_tokens :]

    def add_tokens(self, token_ids: list[int]) -> str:
        """Append newly sampled token ids; return the text they complete ("" if none).

        Text of a trailing incomplete multi-byte character is held back and comes out
        with the call that completes it (or with `flush()`). Several ids in one call give
        exactly what one call per id would, joined.
        """
        return "".join(self._add_token(token_id) for token_id in token_ids)

    def _add_token(self, token_id: int) -> str:
        """Append one token id; return the text it completes."""
        self._token_ids.append(token_id)
        unread_text = self._unread_text()
        if unread_text.endswith(REPLACEMENT_CHAR):
            return ""
        return self._emit(unread_text)

    def flush(self) -> str:
        """Return any held-back text once the request has finished (called once, at the end).

        Only non-empty when the output ends inside a character that will never be
        completed; that text then carries U+FFFD, exactly as a full decode would.
        """
        if self._read_offset == len(self._token_ids):
            return ""
        return self._emit(self._unread_text())

    def _unread_text(self) -> str:
        """Text of the tokens after the read offset, decoded with the context before it."""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        window_text = self._decode(self._prefix_offset, len(self._token_ids))
        return window_text[len(prefix_text) :]

    def _emit(self, delta: str) -> str:
        """Record `delta` as emitted and slide the window past the tokens it covers."""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        self._text_parts.append(delta)
        return delta

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(
            self._token_ids[start:end],
            skip_special_tokens=self._skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
