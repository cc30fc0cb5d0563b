"""Guided decoding over the OpenAI HTTP API of a real stack (Redis, gateway, one prefill and one
decode instance with the real SmolLM2), driven by the official `openai` client unchanged:
`response_format=...` and `extra_body={"guided_regex": ...}` outputs parse and validate, streamed
and not; an invalid regex is a 400 with XGrammar's message; a grammar that completes before
min_tokens ends the request with "stop". No blocks are left held (the `client` fixture checks)."""

import json
import re

import jsonschema
import openai
import pytest

CITY = {"type": "object", "properties": {
    "city": {"type": "string", "minLength": 1, "maxLength": 20},
    "country": {"type": "string", "minLength": 1, "maxLength": 20},
    "population_millions": {"type": "integer", "minimum": 0, "maximum": 50}},
    "required": ["city", "country", "population_millions"]}
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
CHOICES = ["positive", "negative", "neutral"]
MAX_TOKENS = 80


@pytest.fixture(scope="module")
def stack(served_stack):
    return served_stack


def ask(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


def test_response_format_json_schema_validates_streamed_and_not(stack, client):
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    messages = ask("Describe the capital of France as JSON.")
    reply = client.chat.completions.create(model=stack.model_folder.name, messages=messages, temperature=0,
                                           max_completion_tokens=MAX_TOKENS, response_format=response_format)
    [choice] = reply.choices
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), CITY)
    stream = client.chat.completions.create(model=stack.model_folder.name, messages=messages, temperature=0,
                                            max_completion_tokens=MAX_TOKENS, response_format=response_format,
                                            stream=True)
    chunks = list(stream)
    assert "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_guided_regex_and_json_object_on_completions(stack, client):
    stream = client.completions.create(model=stack.model_folder.name, prompt="The Berlin wall fell on",
                                       max_tokens=MAX_TOKENS, temperature=1.0, seed=7, stream=True,
                                       extra_body={"guided_regex": DATE})
    chunks = list(stream)
    assert re.fullmatch(DATE, "".join(c.text for chunk in chunks for c in chunk.choices))
    assert chunks[-1].choices[0].finish_reason == "stop"
    reply = client.completions.create(model=stack.model_folder.name, prompt="A JSON object about a cat:",
                                      max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body={"response_format": {"type": "json_object"}})
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].text), dict)


def test_a_grammar_that_completes_before_min_tokens_stops_cleanly(stack, client):
    reply = client.chat.completions.create(
        model=stack.model_folder.name, messages=ask("Sentiment of: 'I love this phone!'"), temperature=0,
        max_completion_tokens=40, extra_body={"structured_outputs": {"choice": CHOICES}, "min_tokens": 30})
    [choice] = reply.choices
    assert (choice.finish_reason, choice.message.content in CHOICES) == ("stop", True)
    assert reply.usage.completion_tokens < 30


def test_an_invalid_regex_is_a_400_with_xgrammars_message(stack, client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=stack.model_folder.name, prompt="Hi", extra_body={"guided_regex": "[0-9"})
    assert (caught.value.status_code, caught.value.body["param"], caught.value.body["message"]) == (
        400, "guided_regex", "guided_regex: Regex parsing error at position 5: Unclosed '['")
