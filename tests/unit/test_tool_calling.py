"""Tool calling without a model: the incremental parsers (streamed piece by piece = whole),
the plan a request's tools and tool_choice make, the guided schemas XGrammar compiles, the
Hermes-style rendering of tools and tool turns through the chat template, and the deltas."""

import json

import pytest
import xgrammar as xgr

from services.gateway.http.schemas import ChatCompletionRequest
from services.gateway.http.tool_choice import ToolOptions, plan_tools
from services.gateway.http.tool_output import ToolCallStream
from services.gateway.http.tool_parser import CallListParser, HermesParser, ToolEvents
from services.gateway.http.to_internal import chat_to_internal
from shared.errors import InvalidRequestError
from shared.tokenization import render_chat_prompt
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                  "required": ["a", "b"]}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
AUTO = ToolOptions(enable_auto_tool_choice=True, tool_call_parser="hermes")


def parse(parser, text: str, step: int) -> tuple[str, list[str], dict[int, str]]:
    events = ToolEvents()
    for start in range(0, len(text), step):
        piece = ToolEvents()
        parser.feed(text[start:start + step], piece)
        events.extend(piece)
    if isinstance(parser, HermesParser):
        parser.finish(events)
    arguments: dict[int, str] = {}
    for index, piece in events.arguments:
        arguments[index] = arguments.get(index, "") + piece
    return events.content, [name for _, name in events.names], arguments


@pytest.mark.parametrize("step", [1, 2, 7, 10_000])
def test_hermes_parser_streamed_in_any_pieces_equals_whole(step):
    text = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}\\"ris"}}\n</tool_call>'
            '<tool_call>[{"arguments": {"a": 1, "b": 2}, "name": "add"}]</tool_call> Done <tool')
    content, names, arguments = parse(HermesParser(), text, step)
    assert content == "Let me check.  Done <tool"
    assert names == ["get_weather", "add"]
    assert [json.loads(arguments[i]) for i in (0, 1)] == [{"city": 'Pa}"ris'}, {"a": 1, "b": 2}]


@pytest.mark.parametrize("step", [1, 3, 10_000])
def test_call_list_parser_reads_the_required_format(step):
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "add", "parameters": {"a": 1, "b": 2}}]'
    content, names, arguments = parse(CallListParser(), text, step)
    assert (content, names) == ("", ["get_weather", "add"])
    assert arguments == {0: '{"city": "Paris"}', 1: '{"a": 1, "b": 2}'}


def test_arguments_stream_before_the_call_closes():
    parser, events = CallListParser(), ToolEvents()
    parser.feed('[{"name": "get_weather", "parameters": {"city": "Pa', events)
    assert events.names == [(0, "get_weather")] and events.arguments == [(0, '{"city": "Pa')]


def test_tool_call_stream_deltas_and_finish_reason():
    plan = plan_tools(ChatCompletionRequest(messages=USER, tools=[WEATHER], tool_choice="auto"), AUTO)
    stream = ToolCallStream(plan)
    content, deltas = stream.feed('Hi <tool_call>{"name": "get_weather", "arguments": {"ci')
    assert content == "Hi "
    [delta] = deltas
    assert delta["id"].startswith("call_") and delta["type"] == "function"
    assert delta["function"] == {"name": "get_weather", "arguments": '{"ci'}
    content, deltas = stream.feed('ty": "Paris"}}</tool_call>', is_last=True)
    assert (content, deltas) == ("", [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}])
    assert stream.finish_reason("stop") == "tool_calls" and stream.finish_reason("length") == "length"
    message = stream.message()
    assert message["content"] == "Hi " and message["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


def test_named_function_stream_is_its_arguments_and_keeps_stop():
    plan = plan_tools(ChatCompletionRequest(messages=USER, tools=[WEATHER, ADD],
                                            tool_choice={"type": "function", "function": {"name": "add"}}), AUTO)
    stream = ToolCallStream(plan)
    assert stream.feed('{"a": 1, ')[1][0]["function"] == {"name": "add", "arguments": '{"a": 1, '}
    stream.feed('"b": 2}', is_last=True)
    assert stream.message()["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    assert stream.message()["content"] is None and stream.finish_reason("stop") == "stop"


@pytest.mark.parametrize("fields, param", [
    (dict(tool_choice="auto"), "tool_choice"),  # needs tools
    (dict(tools=[WEATHER]), "tool_choice"),  # "auto" by default, not enabled here
    (dict(tools=[WEATHER], tool_choice="sometimes"), "tool_choice"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tools=[{"type": "retrieval", "function": {"name": "x"}}], tool_choice="required"), "tools"),
    (dict(tools=[WEATHER], tool_choice="required", guided_regex="a+"), "tool_choice"),
])
def test_bad_tool_requests_name_the_field(fields, param):
    with pytest.raises(InvalidRequestError) as caught:
        chat_to_internal(ChatCompletionRequest(messages=USER, **fields), "r1", ToolOptions())
    assert caught.value.field == param


def test_none_ignores_tools_and_named_and_required_are_guided():
    internal = chat_to_internal(ChatCompletionRequest(messages=USER, tools=[WEATHER], tool_choice="none"), "r1")
    assert not internal.messages[0].sampling.HasField("guided")
    assert "<tools>" not in internal.messages[0].chat.messages[0].content
    named = chat_to_internal(ChatCompletionRequest(
        messages=USER, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}), "r2")
    assert json.loads(named.messages[0].sampling.guided.json_schema) == WEATHER["function"]["parameters"]
    required = chat_to_internal(ChatCompletionRequest(messages=USER, tools=[WEATHER, ADD], tool_choice="required",
                                                      parallel_tool_calls=False), "r3")
    schema = json.loads(required.messages[0].sampling.guided.json_schema)
    assert (schema["minItems"], schema["maxItems"], len(schema["items"]["anyOf"])) == (1, 1, 2)
    grammar = str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False))
    assert '"\\"get_weather\\""' in grammar and '"\\"add\\""' in grammar


def test_tools_and_tool_turns_render_through_the_chat_template(smollm2_tokenizer):  # noqa: F811
    conversation = USER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    internal = chat_to_internal(ChatCompletionRequest(messages=conversation, tools=[WEATHER],
                                                      tool_choice="required"), "r1")
    messages = [{"role": m.role, "content": m.content} for m in internal.messages[0].chat.messages]
    prompt = render_chat_prompt(smollm2_tokenizer, messages)
    assert prompt.startswith("<|im_start|>system\nYou are a function calling AI model.")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in prompt
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>') in prompt
    assert "<|im_start|>tool\n<tool_response>\n18 C, sunny\n</tool_response><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_malformed_calls_never_raise():
    for text in ['<tool_call>{"name": "a\\x", "arguments": {}}</tool_call>', "<tool_call>{]}</tool_call>",
                 '<tool_call>{"name": "f", "arguments": "text"}</tool_call>', "<tool_call>{{{", "</tool_call>"]:
        for step in (1, 10_000):
            parse(HermesParser(), text, step)
    assert parse(HermesParser(), '<tool_call>{"name": "f", "arguments": "text"}</tool_call>', 1)[2] == {0: '"text"'}
