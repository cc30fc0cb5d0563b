"""Gateway settings: every one a command-line flag and a `PDSERVE_*` environment variable.

A flag given on the command line wins over its environment variable, which wins over the
documented default. `parse_settings(argv)` returns a frozen GatewaySettings.
"""

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shared.cluster.keys import validate_name
from shared.errors import InvalidRequestError
from shared.logging_setup import LOG_FORMATS

from services.gateway.limits import RequestLimits, limit_fields

DEFAULT_PORT = 50051
DEFAULT_HTTP_PORT = 8000
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_DEPLOYMENT = "default"
# Longer than the idle timeouts of load balancers in front (AWS ALB: 60 s), so that the gateway
# never closes a pooled connection at the moment a client reuses it.
DEFAULT_HTTP_KEEP_ALIVE_S = 75.0


@dataclass(frozen=True)
class GatewaySettings:
    model: str | None = None  # HF folder, .gguf file or None for the default model
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT  # 0: an ephemeral port (see ready_file)
    redis_url: str = DEFAULT_REDIS_URL
    deployment: str = DEFAULT_DEPLOYMENT
    served_model_name: str | None = None  # None: the resolved model folder's name
    max_model_len: int | None = None  # None: the model's own limit
    default_deadline_s: float = 300.0  # for client calls without a deadline
    max_prefill_retries: int = 2  # further prefill instances tried after a failure
    lease_s: float = 30.0  # how long a decode reservation waits for its Decode call
    routing_cache_s: float = 0.5  # how long a listing of live instances is reused
    prefer_colocated: bool = False
    ready_file: str | None = None  # JSON {"grpc_address": ..., "http_address": ...} once bound
    http_host: str = "127.0.0.1"  # the OpenAI-compatible HTTP API
    http_port: int = DEFAULT_HTTP_PORT  # 0: an ephemeral port; negative: no HTTP API
    no_http: bool = False  # no HTTP API, whatever http_port says
    http_keep_alive_s: float = DEFAULT_HTTP_KEEP_ALIVE_S  # idle HTTP connections are closed after this
    enable_auto_tool_choice: bool = False  # chat tool_choice "auto" (needs tool_call_parser)
    tool_call_parser: str | None = None  # how "auto" finds calls in the text: "hermes"
    # Prometheus /metrics on a port of its own (0: an ephemeral one; -1: none). The HTTP API
    # serves /metrics too, whatever this says.
    metrics_port: int = -1
    drain_timeout_s: float = 20.0  # on SIGTERM: how long open calls and streams get to finish
    log_level: str = "INFO"
    log_format: str = "text"  # or "json": one JSON object per line
    limits: RequestLimits = field(default_factory=RequestLimits)  # services.gateway.limits
    # A gRPC call's request message must arrive whole within this (services.common.malformed_requests).
    request_read_timeout_s: float = 10.0
    # Access (services.gateway.access): API keys and per-key limits (0: off).
    api_key: tuple[str, ...] = field(default=(), repr=False)
    api_keys_file: str | None = None
    metrics_requires_key: bool = False
    rate_limit_rps: float = 0.0
    rate_limit_burst: int = 0  # 0: max(1, rate_limit_rps)
    max_concurrent_per_key: int = 0
    # TLS on the public gRPC and HTTP ports; mutual TLS towards the instances (services.common.tls).
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    instance_tls_ca_file: str | None = None
    instance_tls_cert_file: str | None = None
    instance_tls_key_file: str | None = None

    def __post_init__(self) -> None:
        _check(self.port, "port", lambda v: 0 <= v <= 65535, "must be in [0, 65535]")
        _check(self.http_port, "http_port", lambda v: v <= 65535, "must be <= 65535 (negative: off)")
        _check(self.metrics_port, "metrics_port", lambda v: -1 <= v <= 65535, "must be in [-1, 65535]")
        _check(self.log_format, "log_format", lambda v: v in LOG_FORMATS, f"must be one of {LOG_FORMATS}")
        _check(self.default_deadline_s, "default_deadline_s", lambda v: v > 0, "must be > 0")
        _check(self.max_prefill_retries, "max_prefill_retries", lambda v: v >= 0, "must be >= 0")
        _check(self.lease_s, "lease_s", lambda v: v > 0, "must be > 0")
        _check(self.http_keep_alive_s, "http_keep_alive_s", lambda v: v > 0, "must be > 0")
        _check(self.tool_call_parser, "tool_call_parser", lambda v: v in (None, "hermes"),
               "must be hermes (the only parser)")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise InvalidRequestError("tool_call_parser", "is required with enable_auto_tool_choice")
        _check(self.drain_timeout_s, "drain_timeout_s", lambda v: v >= 0, "must be >= 0")
        _check(self.routing_cache_s, "routing_cache_s", lambda v: v >= 0, "must be >= 0")
        validate_name("deployment", self.deployment)
        if self.max_model_len is not None:
            _check(self.max_model_len, "max_model_len", lambda v: v >= 2, "must be >= 2")
        _check(self.request_read_timeout_s, "request_read_timeout_s", lambda v: v > 0, "must be > 0")
        _check(self.rate_limit_rps, "rate_limit_rps", lambda v: v >= 0, "must be >= 0")
        _check(self.rate_limit_burst, "rate_limit_burst", lambda v: v >= 0, "must be >= 0")
        _check(self.max_concurrent_per_key, "max_concurrent_per_key", lambda v: v >= 0, "must be >= 0")
        _check_pair(self, "tls_cert_file", "tls_key_file")
        _check_pair(self, "instance_tls_cert_file", "instance_tls_key_file")

    @property
    def serves_http(self) -> bool:
        return self.http_port >= 0 and not self.no_http


def _check(value, field: str, is_ok: Callable[[object], bool], message: str) -> None:
    if not is_ok(value):
        raise InvalidRequestError(field, f"{message}, got {value!r}")


def _check_pair(settings: GatewaySettings, first: str, second: str) -> None:
    if bool(getattr(settings, first)) != bool(getattr(settings, second)):
        raise InvalidRequestError(first, f"{first} and {second} go together")


def env_name(flag: str) -> str:
    """`--redis-url` -> `PDSERVE_REDIS_URL`."""
    return "PDSERVE_" + flag.lstrip("-").replace("-", "_").upper()


def _env_bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _key_list(value: str) -> tuple[str, ...]:
    """PDSERVE_API_KEY: comma-separated keys (the flag is repeated instead)."""
    return tuple(key.strip() for key in value.split(",") if key.strip())


# flag, type, help; the default comes from GatewaySettings.
_FLAGS: tuple[tuple[str, Callable[[str], object], str], ...] = (
    ("--model", str, "HF folder, .gguf file or model name (default: bundled SmolLM2-135M-Instruct)"),
    ("--host", str, "address to bind (default: 127.0.0.1)"),
    ("--port", int, f"gRPC port; 0 binds an ephemeral one (default: {DEFAULT_PORT})"),
    ("--redis-url", str, f"cluster-state Redis (default: {DEFAULT_REDIS_URL})"),
    ("--deployment", str, f"deployment name in Redis keys (default: {DEFAULT_DEPLOYMENT})"),
    ("--served-model-name", str, "model name clients use (default: the model folder's name)"),
    ("--max-model-len", int, "prompt + output limit (default: the model's own)"),
    ("--default-deadline-s", float, "deadline of calls that carry none (default: 300)"),
    ("--max-prefill-retries", int, "other prefill instances tried after one fails (default: 2)"),
    ("--lease-s", float, "decode reservation lease, seconds (default: 30)"),
    ("--routing-cache-s", float, "reuse of the live-instance listing, seconds (default: 0.5)"),
    ("--prefer-colocated", _env_bool, "route to colocated instances first (default: off)"),
    ("--ready-file", str, "write {\"grpc_address\": ..., \"http_address\": ...} here once bound"),
    ("--http-host", str, "address the OpenAI-compatible HTTP API binds (default: 127.0.0.1)"),
    ("--http-port", int, f"HTTP API port; 0 binds an ephemeral one, negative turns it off "
                         f"(default: {DEFAULT_HTTP_PORT})"),
    ("--no-http", _env_bool, "serve no HTTP API (default: off)"),
    ("--http-keep-alive-s", float, f"close idle HTTP connections after this many seconds "
                                   f"(default: {DEFAULT_HTTP_KEEP_ALIVE_S:g})"),
    ("--metrics-port", int, "Prometheus /metrics port of its own; 0 binds an ephemeral one "
                            "(default: -1, none; the HTTP API serves /metrics anyway)"),
    ("--enable-auto-tool-choice", _env_bool, "let chat requests use tool_choice \"auto\" (needs "
                                             "--tool-call-parser; default: off)"),
    ("--tool-call-parser", str, "how tool calls are found in \"auto\" output: hermes (<tool_call> tags)"),
    ("--drain-timeout-s", float, "on SIGTERM, seconds open calls and streams get to finish "
                                 "while new ones are refused (default: 20)"),
    ("--log-level", str, "Python logging level (default: INFO)"),
    ("--log-format", str, "log lines as text or one JSON object each: text or json (default: text)"),
    ("--request-read-timeout-s", float, "a gRPC request message must arrive whole within this "
                                        "(default: 10)"),
    ("--api-key", _key_list, "require 'Authorization: Bearer <key>' (repeatable; the variable is "
                             "comma separated) (default: none, open)"),
    ("--api-keys-file", str, "more API keys, one a line (# comments)"),
    ("--metrics-requires-key", _env_bool, "GET /metrics needs an API key too (default: open)"),
    ("--rate-limit-rps", float, "requests per second per API key (default: 0, unlimited)"),
    ("--rate-limit-burst", int, "token-bucket burst per API key (default: the rate, at least 1)"),
    ("--max-concurrent-per-key", int, "requests in flight per API key (default: 0, unlimited)"),
    ("--tls-cert-file", str, "serve gRPC and HTTP over TLS with this PEM certificate (chain)"),
    ("--tls-key-file", str, "the PEM private key of --tls-cert-file"),
    ("--instance-tls-ca-file", str, "CA that signed the instances' certificates: gRPC to them over TLS"),
    ("--instance-tls-cert-file", str, "client certificate presented to the instances (mutual TLS)"),
    ("--instance-tls-key-file", str, "the PEM private key of --instance-tls-cert-file"),
)


def _limit_flags() -> tuple[tuple[str, Callable[[str], object], str], ...]:
    """One flag per request limit, e.g. `--max-prompt-bytes` (services.gateway.limits)."""
    return tuple(("--" + f.name.replace("_", "-"), int, f"{f.metadata['help']} (default: {f.default})")
                 for f in limit_fields())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register every gateway flag (also used by `pdserve serve gateway`)."""
    for flag, kind, help_text in _FLAGS + _limit_flags():
        help_text = f"{help_text} [env {env_name(flag)}]"
        if kind is _env_bool:
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
        elif kind is _key_list:
            parser.add_argument(flag, action="append", default=None, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=None, help=help_text)


def settings_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> GatewaySettings:
    """Flags first, then PDSERVE_* variables, then the defaults."""
    environ = os.environ if environ is None else environ
    values = _read_flags(args, environ, _FLAGS)
    limits = RequestLimits(**_read_flags(args, environ, _limit_flags()))
    return GatewaySettings(**values, limits=limits)


def _read_flags(args: argparse.Namespace, environ, flags) -> dict[str, object]:
    values = {}
    for flag, kind, _ in flags:
        name = flag.lstrip("-").replace("-", "_")
        value = getattr(args, name, None)
        if isinstance(value, list):
            value = tuple(value)
        if value is None and environ.get(env_name(flag)):
            value = _parse_env(flag, kind, environ[env_name(flag)])
        if value is not None:
            values[name] = value
    return values


def _parse_env(flag: str, kind: Callable[[str], object], text: str) -> object:
    try:
        return kind(text)
    except ValueError as error:
        raise InvalidRequestError(env_name(flag), f"cannot parse {text!r}: {error}") from error


def parse_settings(argv: Sequence[str] | None = None) -> GatewaySettings:
    parser = argparse.ArgumentParser(prog="python -m services.gateway",
                                     description="pdserve gateway (public gRPC API)")
    add_arguments(parser)
    return settings_from_args(parser.parse_args(argv))
