"""The `/metrics` listener of a service without an HTTP API of its own (engine instances; the
gateway too when `--metrics-port` is set): prometheus_client's server on a daemon thread."""

import logging
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from shared.hosts import host_port, local_host

logger = logging.getLogger(__name__)


class MetricsServer:
    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.address = ""  # "host:port" once started
        self._server: WSGIServer | None = None

    def start(self, host: str, port: int) -> str:
        """Bind host:port (0 = a free port), serve in the background; returns "host:port"."""
        bare_host = host.strip("[]")
        self._server, _ = start_http_server(port, addr=bare_host, registry=self.registry)
        bound_port = self._server.server_port
        self.address = host_port(local_host(host), bound_port)
        logger.info("Prometheus metrics on http://%s/metrics", self.address)
        return self.address

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
