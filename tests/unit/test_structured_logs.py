"""--log-format json: one JSON object per line; a request's lifecycle lines carry its id (as
the `request_id` field), never its prompt; fixed fields (role, instance id) on every line."""

import asyncio
import contextlib
import io
import json
import logging

import grpc
import pytest

from shared.logging_setup.configure import make_handler
from shared.logging_setup.context import bind_request_id
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import generation_pb2 as gen
from shared.pb.pdserve.v1 import instance_pb2 as pb
from tests.unit.test_gateway_service import model  # noqa: F401 - fixture
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.test_instance_services import greedy, make_settings, prompt_ids, running
from tests.unit.test_metrics_gateway import gateway_with_metrics
from tests.unit.test_metrics_instance import fresh_ucx  # noqa: F401 - autouse fixture

SECRET_PROMPT = "The secret pineapple recipe of grandmother Ottilie"


@contextlib.contextmanager
def json_log_lines(context: dict[str, str] | None = None):
    """Collect the root logger's INFO+ lines as parsed JSON objects (the list fills as it runs).
    The root's other handlers (an earlier test's `configure_logging`, with its own context
    fields) are set aside meanwhile: their filters would stamp the same records first."""
    stream, lines = io.StringIO(), []
    handler = make_handler("json", context, stream=stream)
    root = logging.getLogger()
    previous_level, previous_handlers = root.level, list(root.handlers)
    for other in previous_handlers:
        root.removeHandler(other)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        for other in previous_handlers:
            root.addHandler(other)
        root.setLevel(previous_level)
        lines.extend(json.loads(line) for line in stream.getvalue().splitlines())


def messages_of(lines: list[dict], request_id: str) -> list[str]:
    return [line["message"] for line in lines if line.get("request_id") == request_id]


def test_a_json_line_has_the_standard_fields_and_the_extras():
    with json_log_lines({"role": "decode", "instance_id": "decode-7"}) as lines:
        logging.getLogger("pdserve.test").warning("reserved %d blocks", 3, extra={"request_id": "r9"})
        bind_request_id("r10")
        logging.getLogger("pdserve.test").info("bound elsewhere")
        bind_request_id(None)
    first, second = lines
    assert set(first) == {"ts", "level", "logger", "message", "request_id", "role", "instance_id"}
    assert (first["level"], first["logger"], first["message"]) == ("WARNING", "pdserve.test", "reserved 3 blocks")
    assert (first["request_id"], first["role"], first["instance_id"]) == ("r9", "decode", "decode-7")
    assert first["ts"].endswith("Z") and "T" in first["ts"]
    assert second["request_id"] == "r10"


def test_gateway_lifecycle_lines_carry_the_request_id_and_never_the_prompt(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway_with_metrics(redis_server.url, model) as (_, stub):
            with json_log_lines({"role": "gateway"}) as lines:
                request = gw.GenerateRequest(request_id="log-1", text=SECRET_PROMPT,
                                             sampling=gen.SamplingParams(max_tokens=3))
                assert len([m async for m in stub.Generate(request)]) == 3
                with pytest.raises(grpc.aio.AioRpcError):
                    await anext(aiter(stub.Generate(gw.GenerateRequest(request_id="log-2", model="other",
                                                                       text=SECRET_PROMPT))))
            return lines
    lines = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    messages = messages_of(lines, "log-1")
    for start in ("request log-1 received", "request log-1 routed", "request log-1 first token",
                  "request log-1 finished (stop): "):
        assert any(m.startswith(start) for m in messages), (start, messages)
    finished = next(line for line in lines if line["message"].startswith("request log-1 finished"))
    assert (finished["num_generated_tokens"], finished["finish_reason"]) == (3, "stop")
    failed = [line for line in lines if line.get("request_id") == "log-2"]
    assert [line["status"] for line in failed] == ["NOT_FOUND"]
    assert not [line for line in lines if "pineapple" in json.dumps(line)]


def test_instance_lines_carry_the_request_id_of_the_rpc(redis_server, tiny_llama_folder):
    async def scenario():
        settings = make_settings("colocated", tiny_llama_folder, redis_server.url)
        async with running(settings) as colocated:
            with json_log_lines({"role": "colocated"}) as lines:
                call = colocated.stub.Generate(pb.InstanceGenerateRequest(
                    request_id="inst-1", prompt_token_ids=prompt_ids(20, 1), sampling=greedy(4)))
                assert len([t async for m in call for t in m.token_ids]) == 4
                bad = colocated.stub.Generate(pb.InstanceGenerateRequest(request_id="inst-2", sampling=greedy(4)))
                with pytest.raises(grpc.aio.AioRpcError):
                    await bad.read()
            return lines
    lines = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    messages = messages_of(lines, "inst-1")
    assert any(m.startswith("request inst-1 first token after") for m in messages), messages
    assert any(m.startswith("request inst-1 finished (length): 20 prompt tokens (0 cached), 4 generated")
               for m in messages), messages
    assert [line["status"] for line in lines if line.get("request_id") == "inst-2"] == ["INVALID_ARGUMENT"]
