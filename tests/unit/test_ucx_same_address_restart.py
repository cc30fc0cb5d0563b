"""An instance killed and restarted on the same KV address binds its UCX listener at once.

The killed listener's accepted connections sit in TIME_WAIT for 60 s; without SO_REUSEADDR
(UCX_TCP_CM_REUSEADDR, a default of shared.kv_transfer.ucx.env) the new listener failed with
"Device is busy" until they expired, and a restarted decode instance crash-looped for a minute.
A port that a live process still listens on stays refused."""

import os
import signal
import subprocess
import sys

from services.launcher.ports import find_free_port as free_port

SERVER = """
import asyncio, sys
import numpy as np
from shared.kv_transfer.ucx.env import ucxx

async def main():
    async def handler(endpoint):
        await endpoint.recv(np.empty(4, dtype=np.uint8))
        print("received", flush=True)
    try:
        listener = ucxx.create_listener(handler, port=int(sys.argv[1]))
    except Exception as error:
        print("bind failed:", type(error).__name__, flush=True)
        return
    print("listening", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""

CLIENT = """
import asyncio, sys
import numpy as np
from shared.kv_transfer.ucx.env import ucxx

async def main():
    endpoint = await ucxx.create_endpoint("127.0.0.1", int(sys.argv[1]))
    await endpoint.send(np.ones(4, dtype=np.uint8))
    print("sent", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def start(code: str, port: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "UCX_TCP_CM_REUSEADDR"}  # the project's default
    return subprocess.Popen([sys.executable, "-c", code, str(port)], stdout=subprocess.PIPE, text=True, env=env)


def first_line(process: subprocess.Popen, *wanted: str) -> str:
    for line in process.stdout:
        if line.startswith(wanted):
            return line.strip()
    raise AssertionError(f"exited with {process.wait()} before printing {wanted}")


def test_a_listener_killed_with_a_connection_accepted_is_replaced_on_the_same_port_at_once():
    port = free_port()
    server, client = start(SERVER, port), None
    try:
        assert first_line(server, "listening", "bind failed") == "listening"
        client = start(CLIENT, port)
        assert first_line(server, "received") == "received"
        server.send_signal(signal.SIGKILL)
        server.wait()
        restarted = start(SERVER, port)
        try:
            assert first_line(restarted, "listening", "bind failed") == "listening"
            second = start(SERVER, port)  # while the restarted one listens: refused
            try:
                assert first_line(second, "listening", "bind failed").startswith("bind failed")
            finally:
                second.kill()
                second.wait()
        finally:
            restarted.kill()
            restarted.wait()
    finally:
        for process in (server, client):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
