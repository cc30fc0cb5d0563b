"""GatewayServer: binds the gRPC port (and the OpenAI-compatible HTTP port), loads the
model's tokenizer, waits for Redis, serves.

Order at start-up: bind and start both doors (health NOT_SERVING, Generate UNAVAILABLE,
HTTP 503), write the ready file with the bound addresses, load the tokenizer and config (in
a thread), wait until Redis answers, then SERVING. `stop()` drains: NOT_SERVING, finish calls
and HTTP responses within the grace period, let pending Releases run, close channels and Redis.
Prometheus metrics: `GET /metrics` on the HTTP port, and a listener of their own with
--metrics-port (bound at start, before the ready file is written).
"""

import asyncio
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import redis.asyncio

from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace
from shared.cluster.prefix_index import PrefixIndex
from shared.errors import ConfigurationError
from shared.hosts import host_port, local_host
from shared.pb.pdserve.v1 import gateway_pb2_grpc

from services.rpc.message_limits import message_size_options
from services.rpc.server import GrpcServer
from services.rpc.malformed_requests import MalformedRequestInterceptor
from services.settings.redis_client import redis_client
from services.rpc.tracing_interceptors import server_interceptors
from services.gateway.access_interceptor import AccessInterceptor
from services.gateway.channels import InstanceChannels
from services.gateway.cluster_view import ClusterView
from services.gateway.health import GATEWAY_SERVICE_NAME
from services.gateway.heap_trim import gateway_heap_trimmer, trim_heap_forever
from services.gateway.http.app import build_app
from services.gateway.http.server import HttpFrontDoor
from services.gateway.http.tool_choice import ToolOptions
from services.gateway.limits import RequestLimits, check_fits_internal_hops
from services.gateway.metrics import GatewayMetrics
from services.gateway.relay_context import HangTimeouts, RelayContext
from services.gateway.served_model import ServedModel, load_served_model
from services.gateway.servicer import GatewayServicer
from services.gateway.state import GatewayState
from services.gateway.security_setup import (
    access_control, instance_channel_credentials, public_credentials)
from services.gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)

REDIS_POLL_S = 0.2
# How often the gateway drops prefix-index entries of instances that stopped heartbeating.
INDEX_GC_INTERVAL_S = 2.0


class GatewayServer:
    def __init__(self, settings: GatewaySettings,
                 load_model: Callable[[], ServedModel] | None = None):
        self.settings = settings
        self._load_model = load_model or (lambda: load_served_model(
            settings.model, settings.served_model_name, settings.max_model_len))
        self.state = GatewayState(default_deadline_s=settings.default_deadline_s, limits=settings.limits,
                                  lora_modules=settings.lora_module_names,
                                  admission=settings.admission())
        self.access = access_control(settings)
        self.metrics = GatewayMetrics(self.state, self.access)
        self.state.metrics = self.metrics
        self.metrics_address: str | None = None  # "host:port" of the own /metrics listener, if any
        interceptors = [*server_interceptors(), MalformedRequestInterceptor(settings.request_read_timeout_s),
                        AccessInterceptor(self.access)]
        servicer = GatewayServicer(self.state)
        self.grpc = GrpcServer(GATEWAY_SERVICE_NAME, lambda server: gateway_pb2_grpc.add_GatewayServicer_to_server(
                                   servicer, server),
                               settings.host, settings.port, public_credentials(settings),
                               options=public_server_options(settings.limits), interceptors=interceptors)
        self.server = self.grpc.server
        self.health = self.grpc.health
        self.address: str | None = None
        self.http = None
        if settings.serves_http:
            tool_options = ToolOptions(settings.enable_auto_tool_choice, settings.tool_call_parser)
            self.http = HttpFrontDoor(build_app(self.state, self.health, self.access, tool_options),
                                      settings.tls_cert_file, settings.tls_key_file,
                                      keep_alive_s=settings.http_keep_alive_s)
        self.http_address: str | None = None  # "host:port" of the HTTP API, once bound
        self.redis: redis.asyncio.Redis | None = None
        self.channels = InstanceChannels(instance_channel_credentials(settings))
        self._garbage_collector: asyncio.Task | None = None
        self.heap_trimmer = gateway_heap_trimmer(settings.idle_trim_interval_s)
        self._heap_trim: asyncio.Task | None = None

    async def start(self) -> str:
        """Bind and start serving (not yet ready); returns "host:port"."""
        port = await self.grpc.start()
        self.address = host_port(local_host(self.settings.host), port)
        if self.http is not None:
            try:
                self.http_address = await self.http.start(self.settings.http_host, self.settings.http_port)
            except OSError as error:
                raise ConfigurationError("http_port", f"cannot listen on {self.settings.http_host}:"
                                                      f"{self.settings.http_port}: {error.strerror}") from error
        if self.settings.metrics_port >= 0:
            self.metrics_address = self.metrics.server.start(self.settings.host, self.settings.metrics_port)
        if self.settings.ready_file:
            write_ready_file(Path(self.settings.ready_file), self.address, self.http_address, self.metrics_address)
        self._heap_trim = asyncio.create_task(trim_heap_forever(self.heap_trimmer))
        logger.info("gateway listening on %s", self.address)
        return self.address

    async def become_ready(self) -> None:
        """Load the model, connect the cluster view, wait for Redis; then SERVING."""
        model = await asyncio.to_thread(self._load_model)
        check_fits_internal_hops(self.settings.limits, model.max_model_len)
        view = cluster_view(self.settings, model.model_key)
        self.redis = view.registry.redis
        await _wait_for_redis(view)
        self._garbage_collector = asyncio.create_task(view.collect_garbage_forever(INDEX_GC_INTERVAL_S))
        self.state.relay = RelayContext(
            view, self.channels, max_prefill_retries=self.settings.max_prefill_retries, lease_s=self.settings.lease_s,
            prefer_colocated=self.settings.prefer_colocated, placement=self.settings.placement_policy(),
            max_room_wait_s=self.settings.max_room_wait_s,
            hang=HangTimeouts(self.settings.control_call_timeout_s, self.settings.stall_timeout_s,
                              self.settings.health_probe_timeout_s))
        logger.info("prefill placement: %s", self.state.relay.placement)
        self.state.model = model
        await self.health.set_serving(True)
        logger.info("gateway ready: model %s, deployment %s", model.name, self.settings.deployment)

    async def stop(self, grace_s: float = 5.0) -> None:
        await self.health.shut_down()  # GET /health and the health service: NOT_SERVING first
        for task in (self._garbage_collector, self._heap_trim):
            if task is not None:
                task.cancel()
        if self.http is not None:
            await asyncio.gather(self.grpc.stop(grace_s), self.http.stop(grace_s))
        else:
            await self.grpc.stop(grace_s)
        if self.state.relay is not None:
            await self.state.relay.drain_background()
        await self.channels.close()
        if self.redis is not None:
            await self.redis.aclose()
        self.metrics.stop()
        logger.info("gateway stopped")


def public_server_options(limits: RequestLimits) -> list[tuple[str, int]]:
    """The public gRPC port takes requests up to max_request_bytes (larger: RESOURCE_EXHAUSTED
    from gRPC itself) and answers with messages as large as the instances send."""
    receive_limit = message_size_options(limits.max_request_bytes)[0]
    return [receive_limit, message_size_options()[1]]


def cluster_view(settings: GatewaySettings, model_key: str) -> ClusterView:
    """The gateway's view of the cluster, on a Redis client with the --redis-* settings."""
    client = redis_client(settings, settings.redis_url)
    namespace = ClusterNamespace(settings.deployment, model_key)
    return ClusterView(InstanceRegistry(client, namespace), PrefixIndex(client, namespace),
                       cache_s=settings.routing_cache_s, redis_timeout_s=settings.redis_socket_timeout_s)


async def _wait_for_redis(view: ClusterView) -> None:
    num_tries = 0
    while not await view.ping():
        if num_tries % 25 == 0:
            logger.warning("waiting for Redis to answer")
        num_tries += 1
        await asyncio.sleep(REDIS_POLL_S)


def write_ready_file(path: Path, grpc_address: str, http_address: str | None = None,
                     metrics_address: str | None = None) -> None:
    """Atomically write {"grpc_address": ..., "http_address": ... or null} (plus
    "metrics_address" with --metrics-port) so a launcher never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    content = {"grpc_address": grpc_address, "http_address": http_address}
    if metrics_address:
        content["metrics_address"] = metrics_address
    temporary.write_text(json.dumps(content))
    temporary.replace(path)
