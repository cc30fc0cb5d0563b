"""OpenAI API completeness through the official client against fake instances: unknown fields
counted, echo and prompt logprobs, continuous usage stats. The fake prefill scores every prompt
token after the first -1.0; the fake decode answers "Hello world!" in three tokens."""

import asyncio
import json
import logging
import urllib.request

from services.gateway.unknown_fields import MAX_FIELD_NAMES, OTHER_FIELDS, UnknownFields
from shared.pb.pdserve.v1 import generation_pb2 as gen
from shared.tokenization import apply_chat_template, encode_prompt
from tests.unit.gateway_fakes import Behaviour, FakeInstance
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.test_openai_http import (  # noqa: F401 - model is a fixture
    CHAT, MODEL_NAME, DecodeWithLogprobs, http_gateway, model, run, with_pair)


def _metrics_text(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        return reply.read().decode()


def test_unknown_fields_are_accepted_logged_once_and_counted(redis_server, model, caplog):  # noqa: F811
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            await with_pair(gate)
            for _ in range(2):
                await gate.client.completions.create(model=MODEL_NAME, prompt="Hi",
                                                     extra_body={"mystery_knob": 3, "priority": 1})
            await gate.client.chat.completions.create(model=MODEL_NAME, messages=CHAT,
                                                      extra_body={"mystery_knob": True})
            return await asyncio.to_thread(_metrics_text, gate.server.http_address)

    with caplog.at_level(logging.WARNING, logger="services.gateway.unknown_fields"):
        text = run_and_return(scenario)
    name = "pdserve:gateway_unknown_request_fields_total"
    assert f'{name}{{endpoint="completions",field="mystery_knob",model_name="{MODEL_NAME}"}} 2.0' in text
    assert f'{name}{{endpoint="completions",field="priority",model_name="{MODEL_NAME}"}} 2.0' in text
    assert f'{name}{{endpoint="chat.completions",field="mystery_knob",model_name="{MODEL_NAME}"}} 1.0' in text
    logged = [record.getMessage() for record in caplog.records if "not known" in record.getMessage()]
    assert len(logged) == 2 and any("'mystery_knob'" in line for line in logged)


def test_unknown_field_names_are_bounded():
    fields = UnknownFields()
    fields.record("completions", [f"field_{i}" for i in range(MAX_FIELD_NAMES + 5)] + ["x" * 500])
    names = {name for (_, name), _ in fields.rows()}
    assert len(names) == MAX_FIELD_NAMES + 1 and OTHER_FIELDS in names
    assert dict(fields.rows())[("completions", OTHER_FIELDS)] == 6


def run_and_return(scenario):
    result = []

    async def wrapped():
        result.append(await scenario())
    run(wrapped)
    return result[0]


PROMPT = "Say hello"
GENERATED = "Hello world!"  # the fake decode instance's three tokens, 42 43 44


def test_echo_with_logprobs_puts_the_prompt_and_its_logprobs_first(redis_server, model):  # noqa: F811
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            await gate.add(FakeInstance("p0", "prefill"), DecodeWithLogprobs("d0", "decode"))
            reply = await gate.client.completions.create(model=MODEL_NAME, prompt=PROMPT, echo=True, logprobs=1)
            [reserve] = gate.fakes[1].requests_of("Reserve")
            return reply, reserve

    reply, reserve = run_and_return(scenario)
    prompt_ids = encode_prompt(model.tokenizer, PROMPT)
    texts = [model.tokenizer.decode([t]) for t in prompt_ids + [42, 43, 44]]
    [choice] = reply.choices
    assert choice.text == PROMPT + GENERATED
    assert reserve.sampling.prompt_logprobs == 1
    logprobs = choice.logprobs
    assert logprobs.tokens == texts
    assert logprobs.token_logprobs == [None] + [-1.0] * (len(prompt_ids) - 1) + [-0.5] * 3
    assert logprobs.top_logprobs[0] is None and logprobs.top_logprobs[1] == {texts[1]: -1.0}
    assert logprobs.text_offset[:len(prompt_ids)] == [sum(map(len, texts[:i])) for i in range(len(prompt_ids))]
    generated = texts[len(prompt_ids):]
    assert logprobs.text_offset[len(prompt_ids):] == [len(PROMPT) + sum(map(len, generated[:i])) for i in range(3)]
    assert reply.usage.completion_tokens == 3


def test_echo_with_max_tokens_0_returns_the_prompt_alone(redis_server, model):  # noqa: F811
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            await with_pair(gate)
            reply = await gate.client.completions.create(model=MODEL_NAME, prompt=PROMPT, echo=True,
                                                         max_tokens=0, logprobs=0)
            stream = await gate.client.completions.create(
                model=MODEL_NAME, prompt=PROMPT, echo=True, max_tokens=0, logprobs=0, stream=True,
                stream_options={"include_usage": True})
            chunks = [chunk async for chunk in stream]
            p0, d0 = gate.fakes
            return reply, chunks, p0.requests_of("StreamPrefill"), d0.calls

    reply, chunks, prefills, decode_calls = run_and_return(scenario)
    num_prompt_tokens = len(encode_prompt(model.tokenizer, PROMPT))
    assert decode_calls == []  # prompt only: no reservation, no KV transfer, no decode
    assert [(p.sampling.max_tokens, p.decode_ucx_address, len(p.dst_block_ids)) for p in prefills] == [(1, "", 0)] * 2
    for text, logprobs, finish_reason in [
            (reply.choices[0].text, reply.choices[0].logprobs, reply.choices[0].finish_reason),
            ("".join(c.text for chunk in chunks for c in chunk.choices),
             chunks[0].choices[0].logprobs, chunks[-2].choices[0].finish_reason)]:
        assert text == PROMPT and finish_reason == "length"
        assert len(logprobs.tokens) == num_prompt_tokens
        assert logprobs.token_logprobs == [None] + [-1.0] * (num_prompt_tokens - 1)
    assert reply.usage.completion_tokens == 0 and chunks[-1].usage.completion_tokens == 0


def test_echo_streamed_with_n_opens_each_choice_with_its_prompt(redis_server, model):  # noqa: F811
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            await with_pair(gate)
            stream = await gate.client.completions.create(model=MODEL_NAME, prompt=[PROMPT, "Bye"], n=2,
                                                          echo=True, logprobs=0, stream=True)
            return [chunk async for chunk in stream]

    chunks = run_and_return(scenario)
    texts, first_tokens = {}, {}
    for chunk in chunks:
        for c in chunk.choices:
            if c.index not in first_tokens:
                first_tokens[c.index] = c.logprobs.tokens[0]
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {0: PROMPT + GENERATED, 1: PROMPT + GENERATED, 2: "Bye" + GENERATED, 3: "Bye" + GENERATED}
    first_text = model.tokenizer.decode(encode_prompt(model.tokenizer, "Bye")[:1])
    assert first_tokens[0] == first_tokens[1] == "Say" and first_tokens[2] == first_tokens[3] == first_text


def test_prompt_logprobs_on_both_endpoints(redis_server, model):  # noqa: F811
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            await with_pair(gate)
            completion = await gate.client.completions.create(model=MODEL_NAME, prompt=PROMPT,
                                                              extra_body={"prompt_logprobs": 0})
            stream = await gate.client.completions.create(model=MODEL_NAME, prompt=PROMPT, stream=True,
                                                          extra_body={"prompt_logprobs": 0})
            chunks = [chunk async for chunk in stream]
            chat = await gate.client.chat.completions.create(model=MODEL_NAME, messages=CHAT,
                                                             extra_body={"prompt_logprobs": 0})
            sent = [r.sampling.prompt_logprobs for r in gate.fakes[1].requests_of("Reserve")]
            return completion, chunks, chat, sent

    completion, chunks, chat, sent = run_and_return(scenario)
    assert sent == [0, 0, 0]
    prompt_ids = encode_prompt(model.tokenizer, PROMPT)
    expected = [None] + [{str(t): {"logprob": -1.0, "rank": None, "decoded_token": model.tokenizer.decode([t])}}
                         for t in prompt_ids[1:]]
    assert completion.choices[0].prompt_logprobs == expected
    assert chunks[0].choices[0].prompt_logprobs == expected
    chat_ids = apply_chat_template(model.tokenizer, CHAT)
    assert [None if p is None else list(p) for p in chat.prompt_logprobs] == [None] + [[str(t)] for t in chat_ids[1:]]


def test_continuous_usage_stats_put_running_usage_in_every_chunk(redis_server, model):  # noqa: F811
    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            await with_pair(gate)
            options = {"include_usage": True, "continuous_usage_stats": True}
            stream = await gate.client.completions.create(model=MODEL_NAME, prompt=PROMPT, stream=True,
                                                          stream_options=options)
            completion_chunks = [chunk async for chunk in stream]
            stream = await gate.client.chat.completions.create(model=MODEL_NAME, messages=CHAT, stream=True,
                                                               stream_options=options)
            return completion_chunks, [chunk async for chunk in stream]

    completion_chunks, chat_chunks = run_and_return(scenario)
    prompt_tokens = len(encode_prompt(model.tokenizer, PROMPT))
    assert [(c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens)
            for c in completion_chunks[:-1]] == [(prompt_tokens, k, prompt_tokens + k) for k in (1, 2, 3)]
    assert completion_chunks[-1].usage.completion_tokens == 3  # the final usage: it adds up
    chat_prompt_tokens = len(apply_chat_template(model.tokenizer, CHAT))
    assert [c.usage.completion_tokens for c in chat_chunks] == [0, 1, 2, 3, 3]
    assert {c.usage.prompt_tokens for c in chat_chunks[:-1]} == {chat_prompt_tokens}


class DecodeSaying(FakeInstance):
    """A fake decode instance that answers `pieces` (one token each), finishing with "stop"."""

    def __init__(self, *args, pieces: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.pieces = pieces

    async def Decode(self, request, context):
        self.calls.append(("Decode", request))
        for position, text in enumerate(self.pieces):
            message = gen.GenerateResponse(request_id=request.request_id, text=text, token_ids=[100 + position])
            if position == len(self.pieces) - 1:
                message.finish_reason = gen.FINISH_REASON_STOP
                message.usage.CopyFrom(gen.Usage(prompt_tokens=5, completion_tokens=len(self.pieces)))
            yield message


def prefill_saying(pieces: list[str]) -> FakeInstance:
    """The fake prefill instance whose first token is DecodeSaying's first."""
    return FakeInstance("p0", "prefill", Behaviour(first_token=(100, pieces[0])))


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
HERMES_REPLY = ["Sure <tool", '_call>{"name": "get_weather", "argu', 'ments": {"city": "Par', 'is"}}</tool_call>']


def test_auto_tool_calls_in_the_message_and_in_streamed_deltas(redis_server, model):  # noqa: F811
    async def scenario():
        async with http_gateway(redis_server.url, model, enable_auto_tool_choice=True,
                                tool_call_parser="hermes") as gate:
            await gate.add(prefill_saying(HERMES_REPLY), DecodeSaying("d0", "decode", pieces=HERMES_REPLY))
            reply = await gate.client.chat.completions.create(model=MODEL_NAME, messages=CHAT, tools=[WEATHER_TOOL])
            stream = await gate.client.chat.completions.create(model=MODEL_NAME, messages=CHAT, tools=[WEATHER_TOOL],
                                                               tool_choice="auto", stream=True)
            chunks = [chunk async for chunk in stream]
            plain = await gate.client.chat.completions.create(model=MODEL_NAME, messages=CHAT, tools=[WEATHER_TOOL],
                                                              tool_choice="none")
            reserves = gate.fakes[1].requests_of("Reserve")
            return reply, chunks, plain, reserves

    reply, chunks, plain, reserves = run_and_return(scenario)
    [choice] = reply.choices
    assert (choice.message.content, choice.finish_reason) == ("Sure ", "tool_calls")
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function", "get_weather", {"city": "Paris"})
    deltas = [c.delta for chunk in chunks for c in chunk.choices]
    assert "".join(d.content or "" for d in deltas) == "Sure "
    streamed = [call for d in deltas for call in d.tool_calls or []]
    assert streamed[0].function.name == "get_weather" and streamed[0].id.startswith("call_")
    assert [call.function.arguments for call in streamed] == ['{"city": "Par', 'is"}']  # as they came
    assert json.loads("".join(call.function.arguments for call in streamed)) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert plain.choices[0].message.content == "".join(HERMES_REPLY) and not plain.choices[0].message.tool_calls
    assert not any(reserve.sampling.HasField("guided") for reserve in reserves)


def test_required_tool_choice_is_guided_and_returns_each_call(redis_server, model):  # noqa: F811
    reply_text = ['[{"name": "get_weather", "parameters": {"city": ', '"Paris"}}]']

    async def scenario():
        async with http_gateway(redis_server.url, model) as gate:
            await gate.add(prefill_saying(reply_text), DecodeSaying("d0", "decode", pieces=reply_text))
            reply = await gate.client.chat.completions.create(model=MODEL_NAME, messages=CHAT, tools=[WEATHER_TOOL],
                                                              tool_choice="required")
            named = await gate.client.chat.completions.create(
                model=MODEL_NAME, messages=CHAT, tools=[WEATHER_TOOL],
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
            return reply, named, gate.fakes[1].requests_of("Reserve")

    reply, named, reserves = run_and_return(scenario)
    [call] = reply.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments, reply.choices[0].finish_reason) == (
        "get_weather", '{"city": "Paris"}', "tool_calls")
    required_schema = json.loads(reserves[0].sampling.guided.json_schema)
    assert required_schema["items"]["anyOf"][0]["properties"]["parameters"] == WEATHER_TOOL["function"]["parameters"]
    assert json.loads(reserves[1].sampling.guided.json_schema) == WEATHER_TOOL["function"]["parameters"]
    [named_call] = named.choices[0].message.tool_calls
    assert named_call.function.arguments == "".join(reply_text)  # a named function's output is its arguments
    assert named.choices[0].finish_reason == "stop"
