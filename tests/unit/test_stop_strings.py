"""StopStringMatcher: cutting streamed text at the first stop string, never taking text back."""

import pytest
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401  (pytest fixture)

from shared.errors import InvalidRequestError
from shared.tokenization import IncrementalDetokenizer, StopStringMatcher, encode_prompt


def push_all(matcher: StopStringMatcher, deltas: list[str]) -> list[tuple[str, bool]]:
    return [matcher.push(delta) for delta in deltas]


def test_no_stop_strings_passes_text_through():
    matcher = StopStringMatcher([])
    assert push_all(matcher, ["Hello", " world"]) == [("Hello", False), (" world", False)]
    assert matcher.flush() == ""
    assert matcher.matched_stop is None


def test_stop_string_spanning_deltas_trims_at_its_start():
    matcher = StopStringMatcher(["world"])
    results = push_all(matcher, [" Hel", "lo", " wor", "ld", "!"])
    assert results == [(" Hel", False), ("lo", False), (" ", False), ("", True), ("", True)]
    assert matcher.matched_stop == "world"
    assert matcher.is_stopped


def test_tail_that_may_start_a_stop_string_is_held_then_released():
    matcher = StopStringMatcher(["world"])
    assert matcher.push("Hello wo") == ("Hello ", False)
    assert matcher.push("rm") == ("worm", False)


def test_held_text_is_released_at_flush():
    matcher = StopStringMatcher(["<end>"])
    assert matcher.push("Hello <e") == ("Hello ", False)
    assert matcher.flush() == "<e"
    assert matcher.flush() == ""


def test_stop_at_the_very_start():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.push("STOP here") == ("", True)
    assert matcher.flush() == ""


def test_include_stop_str_in_output_keeps_the_stop_string():
    matcher = StopStringMatcher(["."], include_stop_str_in_output=True)
    assert matcher.push("Hi. There.") == ("Hi.", True)


def test_include_stop_str_spanning_deltas():
    matcher = StopStringMatcher(["</s>"], include_stop_str_in_output=True)
    assert push_all(matcher, ["ok </", "s> more"]) == [("ok ", False), ("</s>", True)]


def test_earliest_stop_string_wins():
    matcher = StopStringMatcher(["world", "lo"])
    assert matcher.push("Hello world") == ("Hel", True)
    assert matcher.matched_stop == "lo"


def test_the_stop_string_completed_first_wins_over_one_starting_earlier():
    # "bc" is complete at the 3rd character, "abcd" only at the 4th.
    matcher = StopStringMatcher(["abcd", "bc"])
    assert matcher.push("abcd") == ("a", True)
    assert matcher.matched_stop == "bc"


def test_stop_strings_completed_together_prefer_the_longest():
    matcher = StopStringMatcher(["bc", "abc"], include_stop_str_in_output=True)
    assert matcher.push("xabcx") == ("xabc", True)
    assert matcher.matched_stop == "abc"


@pytest.mark.parametrize("include_stop", [False, True])
def test_result_does_not_depend_on_how_text_is_split(include_stop):
    stop = ["abcd", "bc", "zz!"]
    text = "xx ab zz zz! abc"
    whole = StopStringMatcher(stop, include_stop).push(text)
    matcher = StopStringMatcher(stop, include_stop)
    per_char = "".join(matcher.push(char)[0] for char in text)
    expected_text = "xx ab zz " + ("zz!" if include_stop else "")
    assert (per_char, matcher.is_stopped) == whole == (expected_text, True)


def run_engine_loop(tokenizer, output_text: str, stop: list[str]) -> tuple[str, int, bool]:
    """Generate `output_text` token by token the way the engine does, ending on EOS.

    Returns (text streamed to the client, number of tokens consumed, stopped by a string).
    """
    prompt_ids = encode_prompt(tokenizer, "Say hi")
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
    matcher = StopStringMatcher(stop)
    streamed = []
    for num_tokens, token_id in enumerate(encode_prompt(tokenizer, output_text), start=1):
        emit, is_stopped = matcher.push(detokenizer.add_tokens([token_id]))
        streamed.append(emit)
        if is_stopped:
            return "".join(streamed), num_tokens, True
    emit, is_stopped = matcher.push(detokenizer.flush())
    streamed += [emit, matcher.flush()]
    return "".join(streamed), num_tokens, is_stopped


def test_stop_string_spanning_real_tokens(smollm2_tokenizer):
    # Tokens: " Hello" " world" "!" " How" ...; the stop completes with " How".
    result = run_engine_loop(smollm2_tokenizer, " Hello world! How are you?", ["ld! Ho"])
    assert result == (" Hello wor", 4, True)


def test_stop_string_after_a_split_character(smollm2_tokenizer):
    # "日" and "語" each take several byte tokens.
    result = run_engine_loop(smollm2_tokenizer, " 日本語 ok", ["語 o"])
    assert result == (" 日本", 8, True)


def test_partial_stop_string_is_flushed_when_generation_ends(smollm2_tokenizer):
    result = run_engine_loop(smollm2_tokenizer, " The answer is 42.</", ["</s>"])
    assert result == (" The answer is 42.</", 8, False)


@pytest.mark.parametrize("stop", [[""], ["ok", 3], "ok"])
def test_invalid_stop_is_rejected(stop):
    with pytest.raises(InvalidRequestError) as error:
        StopStringMatcher(stop)
    assert error.value.field == "stop"
