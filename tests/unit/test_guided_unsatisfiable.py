"""JSON schemas that no value satisfies are refused when the request is validated (before any
compute), naming the field: `{"not": {}}`, `false`, empty enum/anyOf/type, allOf members with
no type in common, a required property that nothing satisfies (shared.guided.unsatisfiable);
and a compiled schema that matches only the empty output is refused by the compiler."""

import pytest

from shared.errors import InvalidRequestError
from shared.guided import GuidedDecodingParams
from shared.guided.compiler import why_useless
from shared.guided.unsatisfiable import why_unsatisfiable
from tests.unit.guided_vocab import tiny_grammar_cache


@pytest.mark.parametrize("schema, reason", [
    ({"not": {}}, '"not": {} refuses every value'),
    ({"not": True, "type": "object"}, '"not": true refuses every value'),
    ({"not": {"description": "anything"}}, '"not": a schema with no constraint refuses every value'),
    (False, "the schema false accepts no value"),
    ({"enum": []}, '"enum": [] allows no value'),
    ({"anyOf": []}, '"anyOf": [] allows no value'),
    ({"type": []}, '"type": [] allows no value'),
    ({"type": "string", "allOf": [{"type": ["integer", "null"]}]},
     'its "type" and the "type" of its "allOf" members have no type in common'),
    ({"allOf": [{"type": "object"}, {"not": {}}]}, 'at allOf[1]: "not": {} refuses every value'),
    ({"type": "object", "properties": {"a": {"properties": {"b": False}, "required": ["b"]}}, "required": ["a"]},
     "at properties.a.properties.b: the schema false accepts no value"),
    ({"anyOf": [False, {"not": {}}]},
     "every member of anyOf accepts no value (at anyOf[0]: the schema false accepts no value, ...)"),
])
def test_schemas_no_value_satisfies_are_named_with_their_reason(schema, reason):
    assert why_unsatisfiable(schema) == reason


@pytest.mark.parametrize("schema", [
    {}, True, {"not": {"type": "string"}}, {"type": "number", "allOf": [{"type": "integer"}]},
    {"properties": {"a": False}}, {"anyOf": [False, {"type": "string"}]}, {"type": "object"},
    {"enum": [1]}, {"allOf": [{"$ref": "#/x"}, {"type": "string"}]},
])
def test_satisfiable_schemas_pass(schema):
    assert why_unsatisfiable(schema) is None


def test_a_deeply_nested_schema_is_looked_into_only_so_far():
    schema = {"not": {}}
    for _ in range(5000):
        schema = {"allOf": [schema]}
    assert why_unsatisfiable(schema) is None


@pytest.mark.parametrize("schema", ['{"not": {}}', "false", {"not": {}}, '{"enum": []}'])
def test_params_refuse_them_naming_guided_json_schema(schema):
    with pytest.raises(InvalidRequestError) as caught:
        GuidedDecodingParams(json_schema=schema)
    assert caught.value.field == "guided.json_schema"
    assert caught.value.message.startswith("no value satisfies this schema: ")


def test_a_grammar_matching_only_the_empty_output_is_no_json_schema():
    cache = tiny_grammar_cache()
    empty_only = cache.compile(GuidedDecodingParams(grammar='root ::= ""'))  # a grammar may mean it
    assert why_useless(empty_only, "json_schema", cache.tokenizer_info) == (
        "no value satisfies this schema: it matches only the empty output, which is no JSON value")
    a_or_empty = cache.compile(GuidedDecodingParams(grammar='root ::= "a" | ""'))
    assert why_useless(a_or_empty, "json_schema", cache.tokenizer_info) is None
