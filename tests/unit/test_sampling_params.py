"""SamplingParams: defaults, normalisation, properties, and each validation error's field."""

import pytest

from shared.errors import InvalidRequestError
from shared.sampling import SamplingParams


def test_defaults_match_vllm():
    params = SamplingParams()
    assert (params.n, params.best_of, params.temperature, params.top_p, params.top_k) == (
        1, None, 1.0, 1.0, 0)
    assert (params.min_p, params.repetition_penalty, params.presence_penalty,
            params.frequency_penalty) == (0.0, 1.0, 0.0, 0.0)
    assert (params.seed, params.max_tokens, params.min_tokens) == (None, 16, 0)
    assert (params.stop, params.stop_token_ids, params.ignore_eos) == ([], [], False)
    assert (params.logprobs, params.prompt_logprobs) == (None, None)
    assert params.skip_special_tokens is True
    assert params.include_stop_str_in_output is False


def test_single_stop_string_is_wrapped_and_sequences_become_lists():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b"), stop_token_ids=(5, 6)).stop == ["a", "b"]
    assert SamplingParams(stop_token_ids=(5, 6)).stop_token_ids == [5, 6]


@pytest.mark.parametrize("temperature, is_greedy", [
    (0.0, True), (0.9e-5, True), (1e-5, False), (0.7, False), (1.0, False)])
def test_is_greedy_below_1e_minus_5(temperature, is_greedy):
    assert SamplingParams(temperature=temperature).is_greedy is is_greedy


def test_needs_penalties_only_when_a_penalty_is_set():
    assert not SamplingParams().needs_penalties
    assert SamplingParams(repetition_penalty=1.2).needs_penalties
    assert SamplingParams(presence_penalty=-0.5).needs_penalties
    assert SamplingParams(frequency_penalty=0.1).needs_penalties


def test_truncation_flags():
    assert not SamplingParams(top_k=-1).uses_top_k
    assert not SamplingParams(top_k=0).uses_top_k
    assert SamplingParams(top_k=5).uses_top_k
    assert SamplingParams(top_p=0.9).uses_top_p and not SamplingParams().uses_top_p
    assert SamplingParams(min_p=0.1).uses_min_p and not SamplingParams().uses_min_p


@pytest.mark.parametrize("kwargs, field", [
    ({"n": 0}, "n"),
    ({"n": 2, "best_of": 3}, "best_of"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"min_p": -0.01}, "min_p"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"presence_penalty": 2.1}, "presence_penalty"),
    ({"presence_penalty": -2.1}, "presence_penalty"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"frequency_penalty": -3.0}, "frequency_penalty"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 17, "max_tokens": 16}, "min_tokens"),
    ({"logprobs": -1}, "logprobs"),
    ({"logprobs": 21}, "logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ({"stop": ["ok", ""]}, "stop"),
    ({"stop": ""}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"seed": 1.5}, "seed"),
    ({"seed": "7"}, "seed"),
])
def test_each_invalid_value_names_its_field(kwargs, field):
    with pytest.raises(InvalidRequestError) as raised:
        SamplingParams(**kwargs)
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")


@pytest.mark.parametrize("kwargs", [
    {"n": 3, "best_of": 3}, {"temperature": 0.0}, {"top_p": 1.0}, {"top_k": -1},
    {"min_p": 1.0}, {"presence_penalty": -2.0, "frequency_penalty": 2.0},
    {"max_tokens": None, "min_tokens": 100}, {"min_tokens": 16, "max_tokens": 16},
    {"logprobs": 0, "prompt_logprobs": 20}, {"seed": -5},
])
def test_boundary_values_are_accepted(kwargs):
    SamplingParams(**kwargs).validate(vocab_size=10)


def test_stop_token_ids_are_checked_against_the_vocab_only_when_it_is_known():
    params = SamplingParams(stop_token_ids=[9, 10])
    with pytest.raises(InvalidRequestError) as raised:
        params.validate(vocab_size=10)
    assert raised.value.field == "stop_token_ids"
    assert "10" in raised.value.message
    params.validate(vocab_size=11)


def test_validate_rechecks_fields_changed_after_construction():
    params = SamplingParams()
    params.temperature = -1.0
    with pytest.raises(InvalidRequestError) as raised:
        params.validate()
    assert raised.value.field == "temperature"
