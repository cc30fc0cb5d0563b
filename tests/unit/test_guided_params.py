"""GuidedDecodingParams: exactly one constraint, each bad shape named by its field; the wire form."""

import pytest

from shared.errors import InvalidRequestError
from shared.guided import GuidedDecodingParams
from shared.pb.pdserve.v1 import generation_pb2 as pb
from shared.sampling import SamplingParams
from shared.wire.sampling import sampling_from_proto, sampling_to_proto


@pytest.mark.parametrize("kwargs, kind, text", [
    ({"json_schema": '{"type": "integer"}'}, "json_schema", '{"type": "integer"}'),
    ({"json_schema": {"type": "string", "enum": ["é"]}}, "json_schema", '{"type": "string", "enum": ["é"]}'),
    ({"json_object": True}, "json_object", ""),
    ({"regex": r"\d+"}, "regex", r"\d+"),
    ({"choice": ["yes", "no"]}, "choice", '["yes", "no"]'),
    ({"grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"'),
])
def test_kind_and_cache_text(kwargs, kind, text):
    guided = GuidedDecodingParams(**kwargs)
    assert (guided.kind, guided.text, guided.field_name) == (kind, text, f"guided.{kind}")


@pytest.mark.parametrize("kwargs, field, message", [
    ({}, "guided", "set exactly one of json_schema, json_object, regex, choice, grammar; got none"),
    ({"regex": "a", "choice": ["a"]}, "guided", "got regex, choice"),
    ({"json_schema": ""}, "guided.json_schema", "must be a non-empty JSON string or a dict"),
    ({"json_schema": 5}, "guided.json_schema", "must be a non-empty JSON string or a dict, got 5"),
    ({"json_schema": {"x": {1, 2}}}, "guided.json_schema", "must be JSON-serialisable"),
    ({"json_object": False}, "guided.json_object", "must be true when set, got False"),
    ({"regex": ""}, "guided.regex", "must be a non-empty string, got ''"),
    ({"choice": []}, "guided.choice", "must be a non-empty list of strings, got []"),
    ({"choice": "yes"}, "guided.choice", "must be a non-empty list of strings, got 'yes'"),
    ({"choice": ["a", 3]}, "guided.choice", "must contain only strings, got 3"),
    ({"grammar": None, "json_object": None}, "guided", "got none"),
    ({"grammar": 7}, "guided.grammar", "must be a non-empty string, got 7"),
])
def test_bad_shapes_name_the_field(kwargs, field, message):
    with pytest.raises(InvalidRequestError) as caught:
        GuidedDecodingParams(**kwargs)
    assert caught.value.field == field
    assert message in caught.value.message


def test_sampling_params_default_to_unguided_and_check_the_type():
    assert SamplingParams().guided is None
    guided = GuidedDecodingParams(regex="[ab]")
    assert SamplingParams(guided=guided).guided is guided
    with pytest.raises(InvalidRequestError, match="^guided: must be a GuidedDecodingParams or None, got dict$"):
        SamplingParams(guided={"regex": "a"})


@pytest.mark.parametrize("guided", [
    GuidedDecodingParams(json_schema='{"type": "object"}'),
    GuidedDecodingParams(json_object=True),
    GuidedDecodingParams(regex=r"[0-9]{4}"),
    GuidedDecodingParams(choice=["left", "right", ""]),
    GuidedDecodingParams(grammar='root ::= "x"+'),
])
def test_wire_round_trip(guided):
    params = SamplingParams(temperature=0.5, max_tokens=9, guided=guided)
    message = sampling_to_proto(params)
    assert message.guided.WhichOneof("constraint") == guided.kind
    back = sampling_from_proto(pb.SamplingParams.FromString(message.SerializeToString()))
    assert back == params


def test_wire_sends_a_dict_schema_as_json_text():
    params = SamplingParams(guided=GuidedDecodingParams(json_schema={"type": "boolean"}))
    assert sampling_to_proto(params).guided.json_schema == '{"type": "boolean"}'
    assert not sampling_to_proto(SamplingParams()).HasField("guided")


@pytest.mark.parametrize("guided, field, message", [
    (pb.GuidedDecoding(), "guided", "set one of json_schema, json_object, regex, choice, grammar"),
    (pb.GuidedDecoding(json_object=False), "guided.json_object", "must be true when set, got False"),
    (pb.GuidedDecoding(choice=pb.GuidedChoice()), "guided.choice", "must be a non-empty list"),
    (pb.GuidedDecoding(regex=""), "guided.regex", "must be a non-empty string"),
])
def test_wire_rejects_empty_or_false_constraints(guided, field, message):
    with pytest.raises(InvalidRequestError) as caught:
        sampling_from_proto(pb.SamplingParams(guided=guided))
    assert caught.value.field == field
    assert message in caught.value.message
