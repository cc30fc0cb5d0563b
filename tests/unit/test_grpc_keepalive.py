"""An instance's server pings its callers (services.rpc.server.keepalive_options): a
caller that is alive but stopped (SIGSTOP: a hung gateway) leaves the ping unanswered, and
the server closes its connection, cancelling its calls, which frees what they held. Without
the pings the call would stay open until the caller resumed."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import grpc

from shared.pb.pdserve.v1 import instance_pb2_grpc
from services.rpc.server import keepalive_options

CALLER = textwrap.dedent("""
    import sys, time, grpc
    from shared.pb.pdserve.v1 import instance_pb2, instance_pb2_grpc
    channel = grpc.insecure_channel(sys.argv[1])
    call = instance_pb2_grpc.InstanceStub(channel).Decode(instance_pb2.DecodeRequest(request_id="r"))
    for _ in call:
        pass
""")


class _OpenStream(instance_pb2_grpc.InstanceServicer):
    """Decode that stays open until its caller goes away."""

    def __init__(self):
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def Decode(self, request, context):
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        yield  # pragma: no cover - never reached


def test_a_stopped_callers_call_is_cancelled_by_the_servers_pings():
    async def scenario():
        servicer = _OpenStream()
        server = grpc.aio.server(options=keepalive_options(0.2, 0.5))
        instance_pb2_grpc.add_InstanceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        caller = subprocess.Popen([sys.executable, "-c", CALLER, f"127.0.0.1:{port}"],
                                  env={**os.environ, "PYTHONPATH": os.getcwd()})
        try:
            await asyncio.wait_for(servicer.started.wait(), 60)
            os.kill(caller.pid, signal.SIGSTOP)  # alive, its socket open, answering nothing
            await asyncio.wait_for(servicer.cancelled.wait(), 60)
        finally:
            caller.kill()
            caller.wait()
            await server.stop(0)
    asyncio.run(scenario())
