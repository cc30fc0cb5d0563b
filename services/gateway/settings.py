"""Gateway settings: every one a command-line flag, a `PDSERVE_*` environment variable and a
key of the optional `--config` TOML file (services.settings.service_settings).

A flag given on the command line wins over its environment variable, which wins over the
settings file, which wins over the documented default. `parse_settings(argv)` returns a
frozen GatewaySettings; the request limits (services.gateway.limits) are settings of it too.
"""

import argparse
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from shared.cluster.keys import validate_name
from shared.lora.request import validate_adapter_name
from shared.errors import ConfigurationError, InvalidRequestError
from shared.logging_setup import LOG_FORMATS

from services.settings.redis_client import RedisClientSettings
from services.settings.service_settings import comma_separated
from services.settings.flags import MANY_VALUES, add_config_flag, add_settings_flags
from services.settings.flags import settings_from_args as load_from_args
from services.observability.tracing_setup import TracingSettings
from services.gateway.admission import DEFAULT_MAX_QUEUE_WAIT_S, Admission
from services.gateway.limits import RequestLimits
from services.gateway.placement import PlacementPolicy
from services.gateway.placement_profile import load_profile, placement_policy
from services.gateway.wait_prediction import DEFAULT_PROMPT_TOKENS_PER_S, profile_prompt_rate

DEFAULT_PORT = 50051
DEFAULT_HTTP_PORT = 8000
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_DEPLOYMENT = "default"
# Longer than the idle timeouts of load balancers in front (AWS ALB: 60 s), so that the gateway
# never closes a pooled connection at the moment a client reuses it.
DEFAULT_HTTP_KEEP_ALIVE_S = 75.0
MAX_PORT = 65535


def _setting(default, help_text: str, **constraints):
    return Field(default=default, description=help_text, **constraints)


class GatewaySettings(RequestLimits, TracingSettings, RedisClientSettings):
    model: str | None = _setting(None, "HF folder, .gguf file or model name (none: the bundled "
                                       "SmolLM2-135M-Instruct)")
    host: str = _setting("127.0.0.1", "address to bind")
    port: int = _setting(DEFAULT_PORT, "gRPC port; 0 binds an ephemeral one (see --ready-file)", ge=0, le=MAX_PORT)
    redis_url: str = _setting(DEFAULT_REDIS_URL, "cluster-state Redis")
    deployment: str = _setting(DEFAULT_DEPLOYMENT, "deployment name in Redis keys")
    served_model_name: str | None = _setting(None, "model name clients use (none: the model folder's name)")
    max_model_len: int | None = _setting(None, "prompt + output limit (none: the model's own)", ge=2)
    lora_modules: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(), json_schema_extra=MANY_VALUES,
        description="LoRA adapters clients may name in `model`, as the instances' name=path (or just names); "
                    "one no live instance serves fails UNAVAILABLE naming it, instead of NOT_FOUND; the "
                    "variable and the settings file list them comma separated")
    default_deadline_s: float = _setting(300.0, "deadline of calls that carry none, seconds", gt=0)
    max_prefill_retries: int = _setting(2, "other prefill instances tried after one fails", ge=0)
    lease_s: float = _setting(30.0, "how long a decode reservation waits for its Decode call, seconds", gt=0)
    # Hung instances (services.gateway.stall_watch): alive (their sockets accept) but not answering.
    control_call_timeout_s: float = _setting(
        10.0, "Reserve, Release and Renew on an instance must answer within this, seconds; a Reserve that does "
              "not is tried on another decode instance", gt=0)
    stall_timeout_s: float = _setting(
        5.0, "a StreamPrefill, Decode or PrefillLocally stream that brings no message for this long has its "
             "instances' health probed; one that does not answer is hung and the stream moves elsewhere, "
             "seconds", gt=0)
    health_probe_timeout_s: float = _setting(
        2.0, "a health probe of an instance (a stalled stream, a failed call) must answer within this, "
             "seconds; one that does not counts as a lost instance", gt=0)
    routing_cache_s: float = _setting(0.5, "reuse of the live-instance listing, seconds", ge=0)
    prefer_colocated: bool = _setting(False, "route to colocated instances first")
    # Conditional disaggregation (services.gateway.placement): prompts prefilled on the decode
    # instance itself. A threshold left unset comes from --profile, else its default.
    local_prefill_max_tokens: int | None = _setting(
        None, "prefill on the decode instance itself (no prefill hop, no KV transfer) when the prompt's "
              "uncached part there is at most this many tokens; 0 = never (unset: from --profile, else 16)", ge=0)
    local_prefill_busy_max_tokens: int | None = _setting(
        None, "the same while the prefill pool is busy (see --prefill-busy-backlog); 0 = never (unset: from "
              "--profile, else 48)", ge=0)
    prefill_busy_backlog: int = _setting(
        2, "the prefill pool is busy when every prefill instance that can feed the decode instance has at "
           "least this many prompts queued or running (heartbeats); 0 = never busy", ge=0)
    # Load shedding (services.gateway.admission).
    max_queue_wait_s: float = _setting(
        DEFAULT_MAX_QUEUE_WAIT_S, "shed a new request (RESOURCE_EXHAUSTED / HTTP 429 with Retry-After) when its "
        "predicted wait for a first token (the prompts ahead of it on the best prefill, or colocated, instance "
        "at their measured prompt tokens/s) is over this, or over its own deadline when sooner, seconds; "
        "0 = never", ge=0)
    max_queued_per_instance: int = _setting(
        0, "shed new requests too while the requests waiting for their first token reach this many per live "
           "prefill (or colocated) instance; 0 = no count limit", ge=0)
    max_room_wait_s: float = _setting(
        300.0, "a request that every decode instance refuses for want of free KV blocks waits its turn for room "
               "(first come first served) this long, or until its deadline when sooner (the default is the default "
               "deadline's: an admitted request waits), before RESOURCE_EXHAUSTED / HTTP 429, seconds; 0 = refuse "
               "at once", ge=0)
    prompt_tokens_per_s: float = _setting(
        0.0, "prompt tokens per second one prefill (or colocated) instance computes, assumed until measured; 0 = "
             "from --profile, else a guess on which no request is refused until 5 busy instance-seconds are "
             "measured", ge=0)
    profile: str | None = _setting(None, "a `pdserve profile` JSON from which the unset local-prefill "
                                         "thresholds are derived, and the prompt rate assumed until measured")
    ready_file: str | None = _setting(None, 'write {"grpc_address": ..., "http_address": ...} here once bound')
    http_host: str = _setting("127.0.0.1", "address the OpenAI-compatible HTTP API binds")
    http_port: int = _setting(DEFAULT_HTTP_PORT, "HTTP API port; 0 binds an ephemeral one, negative "
                                                 "turns the HTTP API off", le=MAX_PORT)
    no_http: bool = _setting(False, "serve no HTTP API, whatever --http-port says")
    http_keep_alive_s: float = _setting(DEFAULT_HTTP_KEEP_ALIVE_S, "close idle HTTP connections after this "
                                                                   "many seconds", gt=0)
    enable_auto_tool_choice: bool = _setting(False, 'let chat requests use tool_choice "auto" (needs '
                                                    "--tool-call-parser)")
    tool_call_parser: Literal["hermes"] | None = _setting(None, 'how tool calls are found in "auto" output: '
                                                                "hermes (<tool_call> tags)")
    # The HTTP API serves /metrics too, whatever this says.
    metrics_port: int = _setting(-1, "Prometheus /metrics port of its own; 0 binds an ephemeral one, -1 none "
                                     "(the HTTP API serves /metrics anyway)", ge=-1, le=MAX_PORT)
    drain_timeout_s: float = _setting(20.0, "on SIGTERM, seconds open calls and streams get to finish "
                                            "while new ones are refused", ge=0)
    idle_trim_interval_s: float = _setting(10.0, "return free heap memory to the OS when the gateway idles "
                                                 "after work, at most this often (0 = never; "
                                                 "services.gateway.heap_trim)", ge=0)
    log_level: str = _setting("INFO", "Python logging level")
    log_format: Literal[LOG_FORMATS] = _setting("text", "log lines as text or one JSON object each")
    # services.rpc.malformed_requests
    request_read_timeout_s: float = _setting(10.0, "a gRPC request message must arrive whole within this, "
                                                   "seconds", gt=0)
    # Access (services.gateway.access): API keys and per-key limits (0: off).
    api_key: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(), repr=False, description="require 'Authorization: Bearer <key>' (repeatable; the "
                                            "variable is comma separated; none: open)")
    api_keys_file: str | None = _setting(None, "more API keys, one a line (# comments)")
    metrics_requires_key: bool = _setting(False, "GET /metrics needs an API key too")
    rate_limit_rps: float = _setting(0.0, "requests per second per API key (0: unlimited)", ge=0)
    rate_limit_burst: int = _setting(0, "token-bucket burst per API key (0: the rate, at least 1)", ge=0)
    max_concurrent_per_key: int = _setting(0, "requests in flight per API key (0: unlimited)", ge=0)
    # TLS on the public gRPC and HTTP ports; mutual TLS towards the instances (services.tls.credentials).
    tls_cert_file: str | None = _setting(None, "serve gRPC and HTTP over TLS with this PEM certificate (chain)")
    tls_key_file: str | None = _setting(None, "the PEM private key of --tls-cert-file")
    instance_tls_ca_file: str | None = _setting(None, "CA that signed the instances' certificates: gRPC to "
                                                      "them over TLS")
    instance_tls_cert_file: str | None = _setting(None, "client certificate presented to the instances "
                                                        "(mutual TLS)")
    instance_tls_key_file: str | None = _setting(None, "the PEM private key of --instance-tls-cert-file")

    @field_validator("lora_modules", mode="before")
    @classmethod
    def _split_modules(cls, value):
        return comma_separated(value)

    @property
    def lora_module_names(self) -> tuple[str, ...]:
        return tuple(module.partition("=")[0] for module in self.lora_modules)

    @field_validator("api_key", mode="before")
    @classmethod
    def _split_keys(cls, value):
        """PDSERVE_API_KEY and the settings file may list keys comma separated."""
        return comma_separated(value)

    @model_validator(mode="after")
    def _check_together(self) -> "GatewaySettings":
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ConfigurationError("tool_call_parser", "is required with enable_auto_tool_choice")
        try:
            validate_name("deployment", self.deployment)
            for name in self.lora_module_names:
                validate_adapter_name(name, "lora_modules")
        except InvalidRequestError as error:
            raise ConfigurationError(error.field, error.message) from None
        if self.profile:
            load_profile(self.profile)  # a bad file stops the gateway before it starts
        _check_pair(self, "tls_cert_file", "tls_key_file")
        _check_pair(self, "instance_tls_cert_file", "instance_tls_key_file")
        return self

    @property
    def serves_http(self) -> bool:
        return self.http_port >= 0 and not self.no_http

    def placement_policy(self) -> PlacementPolicy:
        """Where prompts are prefilled (conditional disaggregation), thresholds resolved."""
        return placement_policy(self.local_prefill_max_tokens, self.local_prefill_busy_max_tokens,
                                self.prefill_busy_backlog, self.profile)

    def admission(self) -> Admission:
        """Load shedding by these settings; the prompt rate assumed until measured is
        --prompt-tokens-per-s, else --profile's, else a guess (services.gateway.wait_prediction)."""
        if self.prompt_tokens_per_s > 0:
            prior, is_a_guess = self.prompt_tokens_per_s, False
        elif self.profile:
            prior, is_a_guess = profile_prompt_rate(load_profile(self.profile)), False
        else:
            prior, is_a_guess = DEFAULT_PROMPT_TOKENS_PER_S, True
        return Admission(self.max_queue_wait_s, self.max_queued_per_instance, prior, prior_is_a_guess=is_a_guess)


def _check_pair(settings: GatewaySettings, first: str, second: str) -> None:
    if bool(getattr(settings, first)) != bool(getattr(settings, second)):
        raise ConfigurationError(first, f"{first} and {second} go together")


def env_name(flag: str) -> str:
    """`--redis-url` -> `PDSERVE_REDIS_URL`."""
    return GatewaySettings.env_name(flag.lstrip("-").replace("-", "_"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register every gateway flag (the request limits last) and --config."""
    add_config_flag(parser)
    own = [name for name in GatewaySettings.model_fields if name not in RequestLimits.model_fields]
    add_settings_flags(parser, GatewaySettings, only=[*own, *RequestLimits.model_fields])


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    """Flags first, then PDSERVE_* variables, then the --config file, then the defaults.
    Raises ConfigurationError naming the first bad setting."""
    return load_from_args(args, GatewaySettings)


def parse_settings(argv: Sequence[str] | None = None) -> GatewaySettings:
    parser = argparse.ArgumentParser(prog="python -m services.gateway",
                                     description="pdserve gateway (public gRPC API)")
    add_arguments(parser)
    return settings_from_args(parser.parse_args(argv))
