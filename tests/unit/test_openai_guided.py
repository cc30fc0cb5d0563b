"""Guided decoding over the OpenAI HTTP API, driven by the official `openai` client against fake
instances: OpenAI's `response_format` and vLLM's `guided_*` / `structured_outputs` fields become
the one `guided` constraint the instances receive; shape errors are 400s naming the OpenAI field
before any instance is called; an invalid schema, regex or grammar is refused at admission by
the decode instance (XGrammar's message, as for gRPC) and comes back as a 400 naming the field
the client used."""

import json

import openai
import pytest

from services.rpc.errors import rpc_errors
from shared.pb.pdserve.v1 import generation_pb2 as gen
from shared.wire.guided import guided_from_proto
from tests.unit.gateway_fakes import FakeInstance
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.guided_vocab import tiny_grammar_cache
from tests.unit.test_openai_http import CHAT, MODEL_NAME, http_gateway, model, run  # noqa: F401 - fixture

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
PERSON_TEXT = json.dumps(PERSON)
GRAMMAR = 'root ::= "a" | "b"'


class GuidedDecode(FakeInstance):
    """A fake decode instance that admits a guided request as the engine does: compiles its
    constraint with XGrammar (the hand-made vocabulary) and refuses it with INVALID_ARGUMENT."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.grammars = tiny_grammar_cache()
        self.num_compiled = 0

    async def Reserve(self, request, context):
        if request.sampling.HasField("guided"):
            self.num_compiled += 1
            async with rpc_errors(context, "Reserve", request.request_id):
                self.grammars.compile(guided_from_proto(request.sampling.guided))
        return await super().Reserve(request, context)


async def start_pair(gate) -> GuidedDecode:
    decode = GuidedDecode("d0", "decode")
    await gate.add(FakeInstance("p0", "prefill"), decode)
    return decode


def create(gate, endpoint: str, stream: bool = False, **fields):
    if endpoint == "chat":
        return gate.client.chat.completions.create(model=MODEL_NAME, messages=CHAT, stream=stream, **fields)
    return gate.client.completions.create(model=MODEL_NAME, prompt="Hi", stream=stream, **fields)


MAPPING_CASES = [  # (endpoint, fields, the GuidedDecoding the instances receive; None: unset)
    ("chat", dict(response_format={"type": "json_schema",
                                   "json_schema": {"name": "person", "schema": PERSON, "strict": True}}),
     gen.GuidedDecoding(json_schema=PERSON_TEXT)),
    ("chat", dict(response_format={"type": "json_object"}), gen.GuidedDecoding(json_object=True)),
    ("chat", dict(response_format={"type": "text"}), None),
    ("completions", dict(extra_body={"response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON}}}), gen.GuidedDecoding(json_schema=PERSON_TEXT)),
    ("completions", dict(extra_body={"response_format": {"type": "json_object"}}),
     gen.GuidedDecoding(json_object=True)),
    ("chat", dict(extra_body={"guided_json": PERSON}), gen.GuidedDecoding(json_schema=PERSON_TEXT)),
    ("completions", dict(extra_body={"guided_json": '{"type": "integer"}'}),
     gen.GuidedDecoding(json_schema='{"type": "integer"}')),
    ("completions", dict(extra_body={"guided_regex": "[0-9]{3}"}), gen.GuidedDecoding(regex="[0-9]{3}")),
    ("chat", dict(extra_body={"guided_choice": ["yes", "no"]}),
     gen.GuidedDecoding(choice=gen.GuidedChoice(choices=["yes", "no"]))),
    ("completions", dict(extra_body={"guided_grammar": GRAMMAR}), gen.GuidedDecoding(grammar=GRAMMAR)),
    ("chat", dict(extra_body={"structured_outputs": {"json": PERSON}}), gen.GuidedDecoding(json_schema=PERSON_TEXT)),
    ("completions", dict(extra_body={"structured_outputs": {"regex": "a+"}}), gen.GuidedDecoding(regex="a+")),
    ("chat", dict(extra_body={"structured_outputs": {"choice": ["x"]}}),
     gen.GuidedDecoding(choice=gen.GuidedChoice(choices=["x"]))),
    ("completions", dict(extra_body={"structured_outputs": {"grammar": GRAMMAR}}), gen.GuidedDecoding(grammar=GRAMMAR)),
    ("chat", dict(extra_body={"structured_outputs": {"json_object": True}}), gen.GuidedDecoding(json_object=True)),
]


def test_every_way_of_asking_becomes_the_one_guided_constraint(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            decode = await start_pair(gate)
            for endpoint, fields, expected in MAPPING_CASES:
                reply = await create(gate, endpoint, **fields)
                assert reply.choices[0].finish_reason == "stop"
                sampling = decode.requests_of("Reserve")[-1].sampling
                got = sampling.guided if sampling.HasField("guided") else None
                assert got == expected, (endpoint, fields)
            assert len(decode.requests_of("Reserve")) == len(MAPPING_CASES)
    run(scenario)


SHAPE_ERRORS = [  # (endpoint, fields, param, message): refused by the gateway itself
    ("chat", dict(response_format={"type": "json_object"}, extra_body={"guided_regex": "a"}), "guided_regex",
     "guided_regex: only one guided-decoding constraint per request; got response_format, guided_regex"),
    ("completions", dict(extra_body={"guided_choice": ["a"], "structured_outputs": {"regex": "a"}}),
     "structured_outputs.regex", "structured_outputs.regex: only one guided-decoding constraint per request; "
                                 "got guided_choice, structured_outputs.regex"),
    ("chat", dict(extra_body={"structured_outputs": {"regex": "a", "grammar": GRAMMAR}}), "structured_outputs.grammar",
     "structured_outputs.grammar: only one guided-decoding constraint per request; "
     "got structured_outputs.regex, structured_outputs.grammar"),
    ("chat", dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     "response_format.json_schema.schema",
     'response_format.json_schema.schema: is required with {"type": "json_schema"}'),
    ("completions", dict(extra_body={"response_format": {"type": "yaml"}}), "response_format.type",
     "response_format.type: must be one of text, json_object, json_schema, got 'yaml'"),
    ("chat", dict(extra_body={"guided_choice": []}), "guided_choice",
     "guided_choice: must be a non-empty list of strings, got []"),
    ("completions", dict(extra_body={"guided_regex": ""}), "guided_regex",
     "guided_regex: must be a non-empty string, got ''"),
    ("chat", dict(extra_body={"structured_outputs": {"json": ""}}), "structured_outputs.json",
     "structured_outputs.json: must be a non-empty JSON string or a dict, got ''"),
    ("chat", dict(extra_body={"guided_json": PERSON, "guided_whitespace_pattern": " *"}), "guided_whitespace_pattern",
     "guided_whitespace_pattern: is not supported: JSON output uses fixed separators (', ' and ': ')"),
    ("completions", dict(extra_body={"structured_outputs": {"structural_tag": "{}"}}),
     "structured_outputs.structural_tag", "structured_outputs.structural_tag: is not supported by this server"),
    ("chat", dict(extra_body={"guided_choice": "yes"}), "guided_choice",
     "guided_choice: Input should be a valid list (at guided_choice)"),
    ("completions", dict(extra_body={"guided_json": {"not": {}}}), "guided_json",
     'guided_json: no value satisfies this schema: "not": {} refuses every value'),
    ("chat", dict(extra_body={"guided_json": "false"}), "guided_json",
     "guided_json: no value satisfies this schema: the schema false accepts no value"),
    ("chat", dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}),
     "response_format.json_schema.schema",
     'response_format.json_schema.schema: no value satisfies this schema: "not": {} refuses every value'),
]


def test_malformed_guided_fields_are_400s_naming_the_field_before_any_instance_call(redis_server, model):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            decode = await start_pair(gate)
            for endpoint, fields, param, message in SHAPE_ERRORS:
                with pytest.raises(openai.BadRequestError) as caught:
                    await create(gate, endpoint, **fields)
                error = caught.value.body
                assert (caught.value.status_code, error["type"], error["param"], error["message"]) == (
                    400, "invalid_request_error", param, message)
            assert decode.calls == []
    run(scenario)


COMPILE_ERRORS = [  # (endpoint, fields, param, message): refused at admission with XGrammar's message
    ("completions", dict(extra_body={"guided_regex": "[0-9"}), "guided_regex",
     "guided_regex: Regex parsing error at position 5: Unclosed '['"),
    ("chat", dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}),
     "response_format.json_schema.schema", 'response_format.json_schema.schema: Unsupported type "objekt"'),
    ("chat", dict(extra_body={"guided_json": {"type": "integer", "minimum": 5, "maximum": 1}}), "guided_json",
     "guided_json: Invalid range: minimum greater than maximum"),
    ("completions", dict(extra_body={"structured_outputs": {"grammar": "root ::= foo"}}), "structured_outputs.grammar",
     'structured_outputs.grammar: EBNF parser error at line 1, column 10: Rule "foo" is not defined'),
    ("chat", dict(extra_body={"guided_grammar": "root ::= foo"}), "guided_grammar",
     'guided_grammar: EBNF parser error at line 1, column 10: Rule "foo" is not defined'),
]


@pytest.mark.parametrize("stream", [False, True])
def test_an_invalid_schema_regex_or_grammar_is_a_400_with_xgrammars_message(redis_server, model, stream):
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            decode = await start_pair(gate)
            for endpoint, fields, param, message in COMPILE_ERRORS:
                with pytest.raises(openai.BadRequestError) as caught:
                    await create(gate, endpoint, stream=stream, **fields)
                error = caught.value.body
                assert (caught.value.status_code, error["param"], error["message"]) == (400, param, message)
            assert decode.num_compiled == len(COMPILE_ERRORS)
            assert (decode.calls, gate.fakes[0].calls) == ([], [])  # refused before any reservation
    run(scenario)
