"""The OpenAI-compatible FastAPI app of the gateway.

`build_app(state, health)` is called once by GatewayServer, with the same GatewayState the
gRPC servicer uses (so both doors share the model, the relay and its counters). Routes:
`POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`,
`GET /metrics` (the gateway's Prometheus metrics, services.gateway.metrics). `openai_app`
serves the generation routes alone; an instance's OpenAI door (services.instance.openai_door)
builds on it with endpoints over its own StreamOpener.
"""

import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from shared.errors import InvalidRequestError
from shared.metrics.registry import CONTENT_TYPE_LATEST, render
from shared.tracing import is_enabled as tracing_is_enabled

from services.gateway.errors import GatewayError
from services.gateway.generation import known_adapters
from services.gateway.state import GatewayState, require_ready
from services.gateway.lora_admin import load_adapter_everywhere, unload_adapter_everywhere
from services.gateway.health import GatewayHealth
from services.gateway.http.chat_builder import ChatBuilder
from services.gateway.http.completion_builder import CompletionBuilder
from services.gateway.access import AccessControl
from services.gateway.http.access_middleware import AccessMiddleware
from services.gateway.http.body_limit import BodyLimit
from services.gateway.http.error_handlers import install_error_handlers
from services.gateway.http.errors import from_invalid_request, gateway_error_response
from services.gateway.http.flow import StreamOpener, respond
from services.gateway.http.logprobs import TokenTexts
from services.gateway.http.prompt_tokens import echoed, tokenized
from services.gateway.http.schemas import ChatCompletionRequest, CompletionRequest, LoRAAdapterBody
from services.gateway.http.tool_choice import ToolOptions
from services.gateway.http.to_internal import chat_to_internal, completion_to_internal
from services.gateway.http.tracing_middleware import TracingMiddleware
from services.gateway.http.unicode_check import check_encodable

OWNER = "pdserve"


class OpenAIEndpoints:
    """The route handlers; each turns every failure into OpenAI's error shape."""

    def __init__(self, state: GatewayState, health: GatewayHealth, tool_options: ToolOptions,
                 streams: StreamOpener | None = None):
        """`streams`: what prompts are generated through (None: the gateway's relay)."""
        self.state = state
        self.health = health
        self.tool_options = tool_options
        self.streams = streams
        self.created = int(time.time())

    async def create_completion(self, body: CompletionRequest, request: Request) -> Response:
        response_id = f"cmpl-{uuid.uuid4().hex}"
        try:
            model, relay = require_ready(self.state)
            check_encodable(body)
            relay.stats.unknown_fields.record("completions", body.model_extra or {})
            internal = completion_to_internal(body, response_id, self.state.limits.max_prompts)
            token_ids = (tokenized(internal.messages, model, internal.renamed)
                         if body.echo or internal.continuous_usage else [])
        except (InvalidRequestError, GatewayError) as error:
            return _error_response(error)
        builder = CompletionBuilder(
            response_id, _answered_as(body.model, model), int(time.time()), internal.n, TokenTexts(model.tokenizer),
            internal.include_usage, internal.continuous_usage, sum(map(len, token_ids)),
            num_logprobs=body.logprobs, echo=echoed(internal.messages, token_ids, model) if body.echo else None,
            is_echo_only=internal.is_echo_only, num_prompt_logprobs=body.prompt_logprobs)
        return await respond(request, self.state, internal, builder, self.streams)

    async def create_chat_completion(self, body: ChatCompletionRequest, request: Request) -> Response:
        response_id = f"chatcmpl-{uuid.uuid4().hex}"
        try:
            model, relay = require_ready(self.state)
            check_encodable(body)
            relay.stats.unknown_fields.record("chat.completions", body.model_extra or {})
            internal = chat_to_internal(body, response_id, self.tool_options)
            token_ids = tokenized(internal.messages, model, internal.renamed) if internal.continuous_usage else []
        except (InvalidRequestError, GatewayError) as error:
            return _error_response(error)
        num_top_logprobs = (body.top_logprobs or 0) if body.logprobs else None
        builder = ChatBuilder(response_id, _answered_as(body.model, model), int(time.time()), internal.n,
                              TokenTexts(model.tokenizer), internal.include_usage, internal.continuous_usage,
                              sum(map(len, token_ids)), num_top_logprobs=num_top_logprobs,
                              num_prompt_logprobs=body.prompt_logprobs, tools=internal.tools)
        return await respond(request, self.state, internal, builder, self.streams)

    async def list_models(self) -> Response:
        """The base model, then every LoRA adapter with its `parent` (as vLLM lists them)."""
        try:
            model, _ = require_ready(self.state)
            adapters = await known_adapters(self.state)
        except GatewayError as error:
            return _error_response(error)
        card = {"id": model.name, "object": "model", "created": self.created, "owned_by": OWNER,
                "root": model.name, "parent": None, "max_model_len": model.max_model_len}
        adapter_cards = [{**card, "id": name, "root": name, "parent": model.name} for name in adapters]
        return JSONResponse({"object": "list", "data": [card, *adapter_cards]})

    async def load_lora_adapter(self, body: LoRAAdapterBody) -> Response:
        try:
            _, relay = require_ready(self.state)
            instance_ids = await load_adapter_everywhere(relay, body.lora_name, body.lora_path or "")
        except (InvalidRequestError, GatewayError) as error:
            return _error_response(error)
        return JSONResponse({"lora_name": body.lora_name, "instances": instance_ids})

    async def unload_lora_adapter(self, body: LoRAAdapterBody) -> Response:
        try:
            _, relay = require_ready(self.state)
            instance_ids = await unload_adapter_everywhere(relay, body.lora_name)
        except (InvalidRequestError, GatewayError) as error:
            return _error_response(error)
        return JSONResponse({"lora_name": body.lora_name, "instances": instance_ids})

    async def export_metrics(self) -> Response:
        """The Prometheus text format (before the gateway is ready: process metrics only)."""
        registry = self.state.metrics.registry if self.state.metrics is not None else None
        body = render(registry) if registry is not None else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def check_health(self) -> Response:
        """200 once the gateway is SERVING (as its gRPC health service says), else 503."""
        is_ready = self.health.is_serving and self.state.model is not None
        return JSONResponse({"status": "serving" if is_ready else "not_serving"},
                            status_code=200 if is_ready else 503)


def _answered_as(requested: str | None, model) -> str:
    """The `model` a response names: the LoRA adapter asked for, else the served model's name."""
    return requested if requested and not model.accepts(requested) else model.name


def _error_response(error: InvalidRequestError | GatewayError) -> Response:
    if isinstance(error, InvalidRequestError):
        return from_invalid_request(error).response()
    return gateway_error_response(error, {})


def build_app(state: GatewayState, health: GatewayHealth, access: AccessControl | None = None,
              tool_options: ToolOptions = ToolOptions()) -> FastAPI:
    endpoints = OpenAIEndpoints(state, health, tool_options)
    app = openai_app(endpoints, access, "pdserve gateway", "OpenAI-compatible API of the pdserve gateway")
    app.add_api_route("/v1/load_lora_adapter", endpoints.load_lora_adapter, methods=["POST"])
    app.add_api_route("/v1/unload_lora_adapter", endpoints.unload_lora_adapter, methods=["POST"])
    app.add_api_route("/metrics", endpoints.export_metrics, methods=["GET"])
    return app


def openai_app(endpoints: OpenAIEndpoints, access: AccessControl | None, title: str, summary: str) -> FastAPI:
    """The generation routes (completions, chat completions, models, health) and the middleware."""
    app = FastAPI(title=title, summary=summary)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=endpoints.state.limits.max_request_bytes)
    app.add_middleware(AccessMiddleware, access=access or AccessControl())
    if tracing_is_enabled():  # outermost: a refused request is traced too
        app.add_middleware(TracingMiddleware)
    app.add_api_route("/v1/completions", endpoints.create_completion, methods=["POST"])
    app.add_api_route("/v1/chat/completions", endpoints.create_chat_completion, methods=["POST"])
    app.add_api_route("/v1/models", endpoints.list_models, methods=["GET"])
    app.add_api_route("/health", endpoints.check_health, methods=["GET"])
    return app
