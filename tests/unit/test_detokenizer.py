"""IncrementalDetokenizer with the real SmolLM2 tokenizer (byte-level BPE).

Token ids used below (SmolLM2): "Say"=36218 " hi"=15876 " Hello"=38699 " world"=905
"!"=17 "Hello"=19556 "<|im_end|>"=2; "日本語" = 23274 115 | 40993 | 179 120 248
(日 and 語 each split over several byte tokens).
"""

import pytest
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401  (pytest fixture)

from shared.tokenization import IncrementalDetokenizer, encode_prompt
from shared.tokenization.detokenizer import NUM_CONTEXT_TOKENS

PROMPT_IDS = [36218, 15876]  # "Say hi"


def stream(tokenizer, prompt_ids, output_ids, skip_special_tokens=True) -> list[str]:
    """Feed `output_ids` one token at a time, as the engine does; return every delta."""
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
    deltas = [detokenizer.add_tokens([token_id]) for token_id in output_ids]
    assert detokenizer.flush() == ""
    assert detokenizer.text == "".join(deltas)
    return deltas


def test_ascii_words_come_out_one_token_at_a_time(smollm2_tokenizer):
    assert stream(smollm2_tokenizer, PROMPT_IDS, [38699, 905, 17]) == [" Hello", " world", "!"]


def test_first_token_keeps_its_leading_space_after_the_prompt(smollm2_tokenizer):
    assert stream(smollm2_tokenizer, PROMPT_IDS, [665]) == [" there"]


def test_first_token_without_space_after_a_chat_prompt(smollm2_tokenizer):
    prompt_ids = encode_prompt(smollm2_tokenizer, "<|im_start|>assistant\n")
    assert stream(smollm2_tokenizer, prompt_ids, [19556, 17]) == ["Hello", "!"]


def test_empty_prompt(smollm2_tokenizer):
    assert stream(smollm2_tokenizer, [], [19556, 905]) == ["Hello", " world"]


def test_cjk_split_over_byte_tokens_is_held_until_complete(smollm2_tokenizer):
    deltas = stream(smollm2_tokenizer, PROMPT_IDS, [23274, 115, 40993, 179, 120, 248])
    assert deltas == ["", "日", "本", "", "", "語"]


@pytest.mark.parametrize(
    "text",
    [" café 😀 naïve 日本語!", " 👍👍 你好世界", "Ωmega résumé 🎉\n¿qué?", "😀"],
)
def test_multibyte_text_never_yields_a_broken_character(smollm2_tokenizer, text):
    output_ids = encode_prompt(smollm2_tokenizer, text)
    deltas = stream(smollm2_tokenizer, PROMPT_IDS, output_ids)
    assert all("\ufffd" not in delta for delta in deltas)
    assert "".join(deltas) == smollm2_tokenizer.decode(output_ids) == text


def test_special_tokens_skipped_by_default(smollm2_tokenizer):
    assert stream(smollm2_tokenizer, PROMPT_IDS, [19556, 2]) == ["Hello", ""]


def test_special_tokens_kept_when_asked(smollm2_tokenizer):
    deltas = stream(smollm2_tokenizer, PROMPT_IDS, [19556, 2], skip_special_tokens=False)
    assert deltas == ["Hello", "<|im_end|>"]


def test_several_tokens_in_one_call(smollm2_tokenizer):
    detokenizer = IncrementalDetokenizer(smollm2_tokenizer, PROMPT_IDS)
    assert detokenizer.add_tokens([38699, 905]) == " Hello world"
    assert detokenizer.add_tokens([23274]) == ""
    assert detokenizer.add_tokens([115, 17]) == "日!"
    assert detokenizer.text == " Hello world日!"
    assert detokenizer.output_token_ids == [38699, 905, 23274, 115, 17]


def test_flush_releases_a_character_that_was_never_completed(smollm2_tokenizer):
    detokenizer = IncrementalDetokenizer(smollm2_tokenizer, PROMPT_IDS)
    assert detokenizer.add_tokens([19556, 23274]) == "Hello"
    assert detokenizer.flush() == "\ufffd"
    assert detokenizer.text == smollm2_tokenizer.decode([19556, 23274]) == "Hello\ufffd"
    assert detokenizer.flush() == ""


class DecodeSpy:
    """Wraps a tokenizer and records how many ids each decode call was given."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.decoded_lengths: list[int] = []

    def decode(self, token_ids, **kwargs):
        self.decoded_lengths.append(len(token_ids))
        return self._tokenizer.decode(token_ids, **kwargs)


def test_each_step_decodes_only_a_small_window(smollm2_tokenizer):
    spy = DecodeSpy(smollm2_tokenizer)
    prompt_ids = encode_prompt(smollm2_tokenizer, "Count: " + "one two three " * 20)
    output_ids = encode_prompt(smollm2_tokenizer, " four five six 日本語" * 30)
    detokenizer = IncrementalDetokenizer(spy, prompt_ids)
    text = "".join(detokenizer.add_tokens([token_id]) for token_id in output_ids)
    assert text == smollm2_tokenizer.decode(output_ids)
    # Context plus the held-back bytes of one character (3) plus the new token.
    assert max(spy.decoded_lengths) <= NUM_CONTEXT_TOKENS + 4
