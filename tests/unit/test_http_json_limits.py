"""Valid JSON that Python's parser will not take (an integer of over 4300 digits, nesting
deeper than the recursion limit allows) is a 400 naming the field and the limit, not
"There was an error parsing the body" (services.gateway.http.json_limits)."""

import asyncio
import json
import sys

from services.gateway.http.json_limits import MAX_JSON_DEPTH, MAX_SCAN_BYTES, parse_limit_error
from tests.helpers.raw_http import assert_openai_error, post
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.test_openai_http import http_gateway, model, run  # noqa: F401 - fixtures

DIGITS = sys.get_int_max_str_digits()
HUGE_INTEGER = "9" * 5000
DEEP_SCHEMA = "[" * 5000 + "]" * 5000


def body(**raw_fields: str) -> bytes:
    """A JSON object whose values are given as raw JSON text."""
    return ("{" + ", ".join(f'"{name}": {value}' for name, value in raw_fields.items()) + "}").encode()


def parse_error(data: bytes) -> BaseException:
    try:
        json.loads(data)
    except (ValueError, RecursionError) as error:
        return error
    raise AssertionError("parsed")


def test_an_integer_over_the_digit_limit_names_its_field():
    data = body(prompt='"Hi 11111"', max_tokens=HUGE_INTEGER, temperature="0.5")
    error = parse_limit_error(parse_error(data), data)
    assert (error.status, error.param) == (400, "max_tokens")
    assert error.message == f"max_tokens: integer has more than {DIGITS} digits"


def test_long_digit_runs_in_strings_and_floats_are_not_blamed():
    data = body(prompt='"' + "1" * 6000 + '"', top_p="0." + "1" * 6000, seed=HUGE_INTEGER)
    assert parse_limit_error(parse_error(data), data).param == "seed"


def test_nesting_too_deep_names_its_field_and_the_depth():
    data = body(prompt='"[[[["', guided_json=DEEP_SCHEMA)
    error = parse_limit_error(parse_error(data), data)
    assert (error.status, error.param) == (400, "guided_json")
    assert error.message == f"guided_json: nested deeper than {MAX_JSON_DEPTH} levels"


def test_a_body_nested_as_deep_as_the_stated_limit_parses():
    json.loads(body(guided_json="[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH))


def test_past_the_scanned_bytes_the_limit_is_named_without_a_field():
    data = body(prompt='"' + "x" * MAX_SCAN_BYTES + '"', max_tokens=HUGE_INTEGER)
    error = parse_limit_error(parse_error(data), data)
    assert (error.param, error.message) == (None, f"the request body: integer has more than {DIGITS} digits")


def test_other_failures_are_not_called_a_limit():
    assert parse_limit_error(ValueError("other"), b"{}") is None
    assert parse_limit_error(None, None) is None


def test_the_gateway_answers_both_with_a_400_naming_the_field(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            address = gate.server.http_address
            cases = [("/v1/completions", body(prompt='"Hi"', max_tokens=HUGE_INTEGER), "max_tokens"),
                     ("/v1/chat/completions", body(messages='[{"role": "user", "content": "Hi"}]',
                                                    guided_json=DEEP_SCHEMA), "guided_json")]
            for path, data, param in cases:
                status, reply, _ = await asyncio.to_thread(post, address, path, data)
                assert_openai_error(status, reply, 400, param)
    run(scenario)
