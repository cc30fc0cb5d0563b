"""The prefill side of the early first token (services.prefill.first_token): the text the
client gets for the first token is what the decode side's output processor will make of it
(the stop strings applied, what could start one held back), and a completion that ends with
it says how, with the held-back text flushed as the decode side would flush it."""

from shared.engine_api.outputs import CompletionOutput, RequestOutput
from shared.pb.pdserve.v1 import generation_pb2 as gen
from shared.sampling.params import SamplingParams
from services.prefill.first_token import FirstTokenText, ending

PROMPT = [5, 6, 7]


def final_output(finish_reason: str, delta_text: str = "", stop_reason=None) -> RequestOutput:
    """The prefill's final output: no new token, its finish, and the detokenizer's flush."""
    completion = CompletionOutput(0, token_ids=[9], finish_reason=finish_reason, stop_reason=stop_reason,
                                  delta_text=delta_text)
    return RequestOutput("r:prefill", PROMPT, [completion])


def test_the_first_token_holds_back_what_could_start_a_stop_string():
    text = FirstTokenText(SamplingParams(stop=["END"]))
    assert text.first("Hi E") == "Hi "
    assert ending(final_output("length"), SamplingParams(stop=["END"], max_tokens=5), 0, 100, text) is None


def test_a_stop_string_in_the_first_token_ends_the_completion_there():
    params = SamplingParams(stop=["lo"], max_tokens=5)
    text = FirstTokenText(params)
    assert text.first("Hello") == "Hel"
    end = ending(final_output("length"), params, 0, 100, text)
    assert (end.finish_reason, end.stop_reason, end.final_text) == (gen.FINISH_REASON_STOP, "lo", "")


def test_with_the_stop_string_included():
    params = SamplingParams(stop=["lo"], include_stop_str_in_output=True, max_tokens=5)
    text = FirstTokenText(params)
    assert text.first("Hello") == "Hello"
    assert ending(final_output("length"), params, 0, 100, text).stop_reason == "lo"


def test_an_engine_stop_keeps_the_engines_reason_and_flushes_the_held_text():
    params = SamplingParams(stop=["END"], max_tokens=5, stop_token_ids=[9])
    text = FirstTokenText(params)
    assert text.first("Hi E") == "Hi "
    end = ending(final_output("stop", stop_reason=9), params, 0, 100, text)
    assert (end.finish_reason, end.stop_reason, end.final_text) == (gen.FINISH_REASON_STOP, 9, "E")


def test_max_tokens_ends_it_with_the_detokenizers_flush():
    params = SamplingParams(max_tokens=3)
    text = FirstTokenText(params)
    assert text.first("a") == "a"
    end = ending(final_output("length", delta_text="\ufffd"), params, 2, 100, text)  # 2 resumed + this one
    assert (end.finish_reason, end.stop_reason, end.final_text) == (gen.FINISH_REASON_LENGTH, None, "\ufffd")
    assert ending(final_output("length"), SamplingParams(max_tokens=4), 2, 100, FirstTokenText(params)) is None


def test_the_models_length_ends_it():
    params = SamplingParams()  # up to the model's length
    assert ending(final_output("length"), params, 0, len(PROMPT) + 1, FirstTokenText(params)).finish_reason == \
        gen.FINISH_REASON_LENGTH
    assert ending(final_output("length"), params, 0, len(PROMPT) + 2, FirstTokenText(params)) is None
