"""A drain hand-back is a typed signal on the wire (trailing metadata), not a message to parse:
a decode instance's handler raises it through `rpc_errors`, the gateway reads only the key."""

import asyncio

import grpc
import pytest

from services.rpc.errors import ServiceError, rpc_errors
from services.rpc.server import instance_grpc_server
from shared.pb.pdserve.v1 import instance_pb2 as pb
from shared.pb.pdserve.v1.instance_pb2_grpc import InstanceStub
from shared.wire.handback import handed_back_message, handed_back_trailer, is_handed_back
from tests.unit.gateway_fakes import FakeInstance


class ReleasingInstance(FakeInstance):
    """Fails Release the way a draining decode fails its streams, or with the same words only."""

    async def Release(self, request, context):
        async with rpc_errors(context, "Release", request.request_id):
            trailer = handed_back_trailer(request.request_id) if request.request_id == "typed" else ()
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, handed_back_message(request.request_id), trailer)


def failed_release(request_id: str) -> grpc.aio.AioRpcError:
    async def scenario():
        server = instance_grpc_server(ReleasingInstance("d0", "decode"), "127.0.0.1", 0)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await InstanceStub(channel).Release(pb.ReleaseRequest(request_id=request_id), timeout=10)
            return failed.value
        finally:
            await server.stop(0)
    return asyncio.run(scenario())


def test_a_hand_back_reaches_the_caller_as_trailing_metadata():
    error = failed_release("typed")
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert is_handed_back(error.trailing_metadata())
    assert "move 'typed' to another instance" in error.details()


def test_the_words_alone_are_not_a_hand_back():
    error = failed_release("words")
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "handed back" in error.details()
    assert not is_handed_back(error.trailing_metadata())
    assert not is_handed_back(None)
