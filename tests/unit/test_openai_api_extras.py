"""OpenAI API completeness through the official client against fake instances: unknown fields
counted, echo and prompt logprobs, continuous usage stats."""

import asyncio
import logging
import urllib.request

from services.gateway.unknown_fields import MAX_FIELD_NAMES, OTHER_FIELDS, UnknownFields
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.test_openai_http import CHAT, MODEL_NAME, http_gateway, model, run, with_pair  # noqa: F401


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
