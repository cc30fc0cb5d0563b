"""HttpFrontDoor: uvicorn serving the OpenAI-compatible app inside the gateway process, on
the gateway's own asyncio loop, beside the gRPC server.

GatewayServer calls `await start(host, port)` once (it binds the socket itself, so a busy
port fails start-up with OSError instead of uvicorn exiting the process, and port 0 yields
the bound ephemeral port) and `await stop(grace_s)` when draining. Uvicorn's own signal
handling is switched off: the gateway's entry point owns SIGINT and SIGTERM.
"""

import asyncio
import contextlib
import logging
import socket

import uvicorn

from shared.hosts import host_port, local_host

logger = logging.getLogger(__name__)

STARTUP_POLL_S = 0.01


class _EmbeddedServer(uvicorn.Server):
    def capture_signals(self):
        return contextlib.nullcontext()


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when the host is)."""
    bare_host = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare_host else socket.AF_INET
    return socket.create_server((bare_host, port), family=family, backlog=1024)


def reachable_address(host: str, port: int) -> str:
    """"host:port" a local client can dial (a wildcard host becomes loopback)."""
    return host_port(local_host(host), port)


class HttpFrontDoor:
    def __init__(self, app, tls_cert_file: str | None = None, tls_key_file: str | None = None,
                 keep_alive_s: float = 75.0):
        """With a certificate and key, HTTPS; idle keep-alive connections close after keep_alive_s."""
        self.app = app
        self.tls_cert_file = tls_cert_file
        self.tls_key_file = tls_key_file
        self.keep_alive_s = keep_alive_s
        self.address: str | None = None
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task | None = None

    async def start(self, host: str, port: int) -> str:
        """Bind, serve in a task, wait until accepting; returns "host:port"."""
        sock = bind_socket(host, port)
        config = uvicorn.Config(self.app, log_config=None, access_log=False, lifespan="off",
                                http="h11", timeout_graceful_shutdown=5,
                                ssl_certfile=self.tls_cert_file, ssl_keyfile=self.tls_key_file,
                                timeout_keep_alive=self.keep_alive_s)
        self._server = _EmbeddedServer(config)
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[sock]), name="gateway-http")
        while not self._server.started:
            if self._task.done():
                sock.close()
                self._task.result()  # raises what stopped it
                raise OSError(f"the HTTP server on {host}:{port} stopped while starting")
            await asyncio.sleep(STARTUP_POLL_S)
        self.address = reachable_address(host, sock.getsockname()[1])
        logger.info("OpenAI-compatible HTTP API on http://%s/v1", self.address)
        return self.address

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let open responses finish within grace_s, then cancel them."""
        if self._server is None or self._task is None:
            return
        self._server.config.timeout_graceful_shutdown = max(1, round(grace_s))
        self._server.should_exit = True
        await asyncio.gather(self._task, return_exceptions=True)
        self._server = self._task = None
