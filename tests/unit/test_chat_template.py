"""Chat template rendering and prompt encoding with the real SmolLM2 tokenizer."""

from types import SimpleNamespace

import pytest
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401  (pytest fixture)

from shared.errors import InvalidRequestError
from shared.tokenization import apply_chat_template, encode_prompt, render_chat_prompt

IM_START_ID = 1
IM_END_ID = 2
SYSTEM_AND_USER = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
]


def test_system_and_user_render_as_chatml_with_the_assistant_turn_open(smollm2_tokenizer):
    assert render_chat_prompt(smollm2_tokenizer, SYSTEM_AND_USER) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_token_ids_parse_the_markup_as_special_tokens(smollm2_tokenizer):
    token_ids = apply_chat_template(smollm2_tokenizer, SYSTEM_AND_USER)
    assert token_ids[0] == IM_START_ID
    assert token_ids.count(IM_START_ID) == 3
    assert token_ids.count(IM_END_ID) == 2
    assert token_ids[-3:] == encode_prompt(smollm2_tokenizer, "assistant\n")
    text = smollm2_tokenizer.decode(token_ids)
    assert text == render_chat_prompt(smollm2_tokenizer, SYSTEM_AND_USER)


def test_without_generation_prompt_the_last_turn_is_closed(smollm2_tokenizer):
    text = render_chat_prompt(smollm2_tokenizer, SYSTEM_AND_USER, add_generation_prompt=False)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n")


def test_template_adds_its_default_system_prompt_when_none_is_given(smollm2_tokenizer):
    text = render_chat_prompt(smollm2_tokenizer, [{"role": "user", "content": "Hi"}])
    assert text.startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
        "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


@pytest.mark.parametrize(
    "messages, message_part",
    [
        ([], "non-empty list"),
        ("Hi", "non-empty list"),
        (["Hi"], "item 0 must be an object"),
        ([{"content": "Hi"}], "item 0 has role None"),
        (
            [{"role": "user", "content": "Hi"}, {"role": "robot", "content": "x"}],
            "item 1 has role 'robot'",
        ),
        ([{"role": "user"}], "item 0 must have string content"),
        ([{"role": "user", "content": ["Hi"]}], "item 0 must have string content"),
    ],
)
def test_malformed_messages_are_rejected(smollm2_tokenizer, messages, message_part):
    with pytest.raises(InvalidRequestError) as error:
        apply_chat_template(smollm2_tokenizer, messages)
    assert error.value.field == "messages"
    assert message_part in error.value.message


def test_tokenizer_without_chat_template_is_a_clear_error():
    tokenizer = SimpleNamespace(chat_template=None)
    with pytest.raises(InvalidRequestError) as error:
        apply_chat_template(tokenizer, SYSTEM_AND_USER)
    assert error.value.field == "messages"
    assert "no chat template" in error.value.message


def test_plain_prompt_gets_no_bos_from_smollm2(smollm2_tokenizer):
    assert encode_prompt(smollm2_tokenizer, "Hello world") == [19556, 905]


class FakeBosTokenizer:
    """A tokenizer whose settings ask for a BOS (Llama-2 style); "<s>" encodes to 1."""

    bos_token_id = 1
    add_bos_token = True

    def encode(self, text, add_special_tokens):
        assert add_special_tokens is False
        return [1, 7] if text.startswith("<s>") else [7]


def test_bos_is_added_once_when_the_tokenizer_wants_one():
    assert encode_prompt(FakeBosTokenizer(), "hi") == [1, 7]
    assert encode_prompt(FakeBosTokenizer(), "<s>hi") == [1, 7]
