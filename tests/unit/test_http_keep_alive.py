"""The HTTP front door keeps idle connections open for its keep-alive setting, then closes them."""

import asyncio
import socket

from fastapi import FastAPI

from services.gateway.http.server import HttpFrontDoor

REQUEST = b"GET /ping HTTP/1.1\r\nHost: test\r\nConnection: keep-alive\r\n\r\n"


def _app() -> FastAPI:
    app = FastAPI()
    app.add_api_route("/ping", lambda: {"ok": True}, methods=["GET"])
    return app


async def _idle_seconds_until_closed(keep_alive_s: float, give_up_s: float) -> float | None:
    """Seconds an idle connection stayed open after its response, None if still open at give_up_s."""
    door = HttpFrontDoor(_app(), keep_alive_s=keep_alive_s)
    host, port = (await door.start("127.0.0.1", 0)).rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(REQUEST)
        assert b"200 OK" in await reader.readuntil(b"\r\n\r\n")
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            while await asyncio.wait_for(reader.read(4096), give_up_s):  # the body, then EOF
                pass
        except TimeoutError:
            return None
        return loop.time() - started
    finally:
        writer.close()
        await door.stop(grace_s=0.5)


def test_idle_connection_is_closed_after_the_keep_alive_setting():
    assert asyncio.run(_idle_seconds_until_closed(keep_alive_s=0.2, give_up_s=30)) is not None


def test_idle_connection_outlives_uvicorns_five_second_default_by_default():
    assert HttpFrontDoor(_app()).keep_alive_s == 75.0
    assert asyncio.run(_idle_seconds_until_closed(keep_alive_s=75.0, give_up_s=6)) is None
