"""Malformed gRPC input, sent as raw HTTP/2 frames to the gateway and to an instance's
server: undecodable protobuf is INVALID_ARGUMENT, invalid UTF-8 in a string field too, naming
the field, a call with no message is
INVALID_ARGUMENT at once, a message that never arrives whole is DEADLINE_EXCEEDED after the
server's read timeout (not the client's deadline), and none of it logs an error. An
instance's error message is bounded, so an engine error embedding a huge schema keeps its
status instead of overflowing the trailers."""

import asyncio
import logging

import grpc
import pytest

from services.rpc.errors import rpc_errors
from services.rpc.server import instance_grpc_server
from shared.errors import InvalidRequestError
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import instance_pb2 as pb
from shared.pb.pdserve.v1.instance_pb2_grpc import InstanceStub
from tests.helpers.raw_h2 import grpc_frame, raw_grpc_call
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import FakeInstance
from tests.unit.test_openai_http import http_gateway, model, run  # noqa: F401

GENERATE = "/pdserve.v1.Gateway/Generate"
LIST_MODELS = "/pdserve.v1.Gateway/ListModels"
INVALID_ARGUMENT, DEADLINE_EXCEEDED, UNAVAILABLE = 3, 4, 14
TEXT_FIELD_TAG = b"\x1a"  # GenerateRequest.text, length-delimited


async def call(address: str, path: str, data: bytes | None, end_stream: bool = True):
    return await asyncio.to_thread(raw_grpc_call, address, path, data, (), end_stream, 20.0)


def test_the_gateway_refuses_malformed_calls_with_a_status_and_no_error_log(redis_server, model, caplog):
    caplog.set_level(logging.INFO)
    valid = gw.GenerateRequest(token_ids=gw.TokenIds(ids=[1, 2])).SerializeToString()

    async def scenario():
        async with http_gateway(redis_server.url, model, request_read_timeout_s=1.0) as gate:
            address = gate.server.address
            for data in (grpc_frame(b"\xff\xff\xff"), None, grpc_frame(b"abc", declared_length=100)):
                reply = await call(address, GENERATE, data)
                assert reply.status == INVALID_ARGUMENT, (data, reply)
                assert reply.message.startswith("request: ")
            reply = await call(address, GENERATE, grpc_frame(TEXT_FIELD_TAG + b"\x02\xff\xfe"))
            assert (reply.status, reply.message) == (INVALID_ARGUMENT, "text: not valid UTF-8 text")
            reply = await call(address, LIST_MODELS, grpc_frame(b"\xff"))
            assert reply.status == INVALID_ARGUMENT
            stalled = await call(address, GENERATE, grpc_frame(valid[:3], declared_length=len(valid)), end_stream=False)
            assert stalled.status == DEADLINE_EXCEEDED and stalled.seconds < 10, stalled
            reply = await call(address, GENERATE, grpc_frame(valid))
            assert reply.status == UNAVAILABLE  # a valid call goes through (no instance registered)
    run(scenario)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_an_instance_refuses_undecodable_requests_with_invalid_argument():
    async def scenario():
        server = instance_grpc_server(FakeInstance("d0", "decode"), "127.0.0.1", 0)
        await server.start()
        try:
            address = f"127.0.0.1:{server.port}"
            reply = await call(address, "/pdserve.v1.Instance/Reserve", grpc_frame(b"\x0a\xff"))
            assert reply.status == INVALID_ARGUMENT, reply
            reply = await call(address, "/pdserve.v1.Instance/Decode", None)
            assert reply.status == INVALID_ARGUMENT, reply
            not_utf8 = pb.ReserveRequest(request_id="r", cache_salt="@@").SerializeToString().replace(b"@@", b"\xc3(")
            reply = await call(address, "/pdserve.v1.Instance/Reserve", grpc_frame(not_utf8))
            assert (reply.status, reply.message) == (INVALID_ARGUMENT, "cache_salt: not valid UTF-8 text")
        finally:
            await server.stop(0)
    asyncio.run(scenario())


class VerboseInstance(FakeInstance):
    """Fails Reserve with an error whose message embeds a 5 MB schema (as XGrammar's do)."""

    async def Reserve(self, request, context):
        async with rpc_errors(context, "Reserve", request.request_id):
            raise InvalidRequestError("guided.json_schema", "cannot compile " + "{" * 5_000_000)


def test_an_instance_error_message_is_bounded_and_keeps_its_code():
    async def scenario():
        server = instance_grpc_server(VerboseInstance("d0", "decode"), "127.0.0.1", 0)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await InstanceStub(channel).Reserve(pb.ReserveRequest(request_id="r"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details().startswith("guided.json_schema: cannot compile {{{")
            assert len(refused.value.details().encode()) <= 1024
        finally:
            await server.stop(0)
    asyncio.run(scenario())
