"""GrammarCache: compiled once per (kind, text), least recently used evicted; XGrammar's own
message, without its source location, on the field that is wrong."""

import pytest

from shared.errors import InvalidRequestError
from shared.guided import GuidedDecodingParams
from shared.guided.compiler import choice_grammar, xgrammar_message
from tests.unit.guided_vocab import tiny_grammar_cache


def test_same_constraint_is_compiled_once():
    cache = tiny_grammar_cache()
    first = cache.compile(GuidedDecodingParams(regex="[0-9]{2}"))
    again = cache.compile(GuidedDecodingParams(regex="[0-9]{2}"))
    assert again is first
    assert (cache.num_hits, cache.num_misses, len(cache)) == (1, 1, 1)


def test_kind_is_part_of_the_key():
    cache = tiny_grammar_cache()
    cache.compile(GuidedDecodingParams(grammar='root ::= "ab"'))
    cache.compile(GuidedDecodingParams(regex='root ::= "ab"'))
    assert (cache.num_hits, cache.num_misses) == (0, 2)


def test_dict_and_text_schemas_with_the_same_json_share_an_entry():
    cache = tiny_grammar_cache()
    cache.compile(GuidedDecodingParams(json_schema={"type": "boolean"}))
    cache.compile(GuidedDecodingParams(json_schema='{"type": "boolean"}'))
    assert (cache.num_hits, cache.num_misses) == (1, 1)


def test_least_recently_used_grammar_is_evicted():
    cache = tiny_grammar_cache(max_entries=2)
    a, b, c = (GuidedDecodingParams(choice=[name]) for name in ("a", "b", "c"))
    cache.compile(a)
    cache.compile(b)
    cache.compile(a)  # a is now the most recent
    cache.compile(c)  # evicts b
    cache.compile(a)
    assert (cache.num_hits, cache.num_misses, len(cache)) == (2, 3, 2)
    cache.compile(b)
    assert cache.num_misses == 4


@pytest.mark.parametrize("guided, field, message", [
    (GuidedDecodingParams(regex="(ab"), "guided.regex",
     "Regex parsing error at position 4: The parenthesis is not closed."),
    (GuidedDecodingParams(regex="(?<=a)b"), "guided.regex",
     "Regex parsing error at position 3: Lookbehind is not supported yet."),
    (GuidedDecodingParams(json_schema='{"type": "foo"}'), "guided.json_schema", 'Unsupported type "foo"'),
    (GuidedDecodingParams(json_schema="[1, 2]"), "guided.json_schema",
     "Schema should be an object or bool, but got [1,2]"),
    (GuidedDecodingParams(json_schema="{not json"), "guided.json_schema",
     "Failed to parse JSON: syntax error at line 1 near: not json. The JSON string is:{not json"),
    (GuidedDecodingParams(grammar="root ::= foo"), "guided.grammar",
     'EBNF parser error at line 1, column 10: Rule "foo" is not defined'),
    (GuidedDecodingParams(grammar='start ::= "a"'), "guided.grammar",
     'EBNF parser error at line 1, column 1: The root rule with name "root" is not found'),
])
def test_invalid_constraints_raise_xgrammars_message_on_the_field(guided, field, message):
    cache = tiny_grammar_cache()
    with pytest.raises(InvalidRequestError) as caught:
        cache.compile(guided)
    assert (caught.value.field, caught.value.message) == (field, message)
    assert len(cache) == 0


def test_xgrammar_message_drops_the_source_location():
    raw = RuntimeError("[20:46:07] /project/cpp/json_schema_converter.cc:5077: Check failed: "
                       "(error.empty()) is false: Failed to parse JSON\n")
    assert xgrammar_message(raw) == "Failed to parse JSON"
    assert xgrammar_message(ValueError("plain")) == "plain"


def test_choice_grammar_escapes_quotes_backslashes_and_newlines():
    assert choice_grammar(['a"b', "c\\d", "e\nf", "é"]) == r'root ::= "a\"b" | "c\\d" | "e\nf" | "é"'
