"""An instance's own OpenAI-compatible HTTP API (--openai-port), for a pod behind a Gateway API
Inference Extension gateway: its endpoint picker sends each request straight to the decode
(or colocated) pod it chose, with no pdserve gateway in between (docs/kubernetes.md).

The door is the gateway's HTTP layer (services.gateway.http.app: the same request parsing,
validation, tokenization, response shaping and errors) over PodStreams: the gateway's
generation path run against this instance (and the prefill instance a request's header names),
reached over gRPC like any instance, so reservations, KV transfer, leases and failures work
exactly as behind the gateway. Routes: POST /v1/completions, POST /v1/chat/completions,
GET /v1/models, GET /health (200 while the instance serves), GET /metrics (the instance's).

Started by InstanceRuntime once the instance serves and is registered; stopped first when it
drains (open responses get --shutdown-grace-s to finish).
"""

import asyncio
import logging
from collections.abc import Callable, Iterator

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client.registry import Collector

from shared.metrics.families import FamilyMaker
from shared.metrics.registry import CONTENT_TYPE_LATEST, render

from services.gateway.channels import InstanceChannels
from services.gateway.cluster_view import ClusterView
from services.gateway.state import GatewayState
from services.gateway.http.app import OpenAIEndpoints, openai_app
from services.gateway.http.server import HttpFrontDoor
from services.gateway.http.tool_choice import ToolOptions
from services.gateway.relay_context import RelayContext
from services.gateway.router import Candidate
from services.gateway.served_model import ServedModel, load_served_model
from services.instance.pod_streams import NamedPrefillCounters, PodStreams
from services.tls.credentials import channel_credentials

logger = logging.getLogger(__name__)

DEFAULT_DEADLINE_S = 300.0  # as the gateway's --default-deadline-s


def served_model(settings) -> ServedModel:
    """The tokenizer and limits of the instance's model (blocking: seconds)."""
    return load_served_model(settings.engine.model, settings.served_model_name or None,
                             settings.engine.max_model_len or None)


class OpenAIDoor:
    def __init__(self, runtime, model: ServedModel):
        settings = runtime.settings
        self.runtime = runtime  # services.instance.runtime.InstanceRuntime
        self.channels = InstanceChannels(_channel_credentials(settings))
        cluster = ClusterView(runtime.presence.registry, runtime.presence.prefix_index,
                              redis_timeout_s=settings.redis_socket_timeout_s)
        self.state = GatewayState(default_deadline_s=DEFAULT_DEADLINE_S, model=model,
                                  relay=RelayContext(cluster, self.channels))
        self.counters = NamedPrefillCounters()
        streams = PodStreams(self.state, cluster, self.own_candidate, self.counters)
        self.http = HttpFrontDoor(self._app(streams), settings.tls_cert_file or None, settings.tls_key_file or None)

    def _app(self, streams: PodStreams) -> FastAPI:
        endpoints = OpenAIEndpoints(self.state, self.runtime.server.health, ToolOptions(), streams)
        app = openai_app(endpoints, None, f"pdserve {self.runtime.role} instance",
                         "OpenAI-compatible API of one pdserve instance")
        app.add_api_route("/metrics", self.export_metrics, methods=["GET"])
        return app

    def own_candidate(self) -> Candidate:
        info = self.runtime.info()
        return Candidate(info.instance_id, info.role, info.grpc_address, cache=info.cache,
                         kv_protocol_version=info.kv_protocol_version, pdserve_version=info.pdserve_version)

    async def start(self, host: str, port: int) -> str:
        """Serve; returns the bound "host:port"."""
        if self.runtime.metrics is not None:
            self.runtime.metrics.registry.register(NamedPrefillCollector(self.counters, self.runtime.metrics.labels))
        return await self.http.start(host, port)

    async def stop(self, grace_s: float) -> None:
        await self.http.stop(grace_s)
        await self.state.relay.drain_background()
        await self.channels.close()

    async def export_metrics(self) -> Response:
        registry = self.runtime.metrics.registry if self.runtime.metrics is not None else None
        return Response(render(registry) if registry is not None else b"", media_type=CONTENT_TYPE_LATEST)


async def start_openai_door(runtime, load_model: Callable[[], ServedModel]) -> OpenAIDoor:
    model = await asyncio.to_thread(load_model)
    door = OpenAIDoor(runtime, model)
    address = await door.start(runtime.settings.host, runtime.settings.openai_port)
    logger.info("%s %s: OpenAI-compatible HTTP API on http://%s/v1", runtime.role, runtime.instance_id, address)
    return door


class NamedPrefillCollector(Collector):
    def __init__(self, counters: NamedPrefillCounters, labels: dict[str, str]):
        self.counters = counters
        self.make = FamilyMaker(labels)

    def collect(self) -> Iterator:
        yield self.make.labelled_counter(
            "pdserve:named_prefills", "Prompts of OpenAI-door requests that named a prefill endpoint, by outcome: "
            "routed (computed there), or why they were computed here (malformed, unknown, not_prefill, "
            "incompatible, failed).", "outcome", sorted(self.counters.outcomes.items()))


def _channel_credentials(settings):
    """Mutual TLS to the instances when this one has a certificate and a CA (None: plain TCP)."""
    if settings.tls_cert_file and settings.tls_ca_file:
        return channel_credentials(settings.tls_ca_file, settings.tls_cert_file, settings.tls_key_file)
    return None
