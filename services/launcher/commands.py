"""Command lines and environment of the stack's service processes."""

import os
from pathlib import Path

from shared.hosts import is_wildcard
from shared.kv_events.config import offset_endpoint_port

from services.launcher.config import StackConfig

SERVICE_MODULES = {
    "prefill": "services.prefill",
    "decode": "services.decode",
    "colocated": "services.decode",
    "gateway": "services.gateway",
}


def module_of(config: StackConfig, kind: str) -> str:
    """The module run with `python -m` for a child of this kind (overridable for tests)."""
    return config.service_modules.get(kind, SERVICE_MODULES[kind])


def _model_args(config: StackConfig) -> list[str]:
    return ["--model", config.model] if config.model else []


def tracing_argv(config: StackConfig) -> list[str]:
    """The tracing flags every child gets (none while tracing is off)."""
    if not config.otlp_traces_endpoint:
        return []
    return [f"--otlp-traces-endpoint={config.otlp_traces_endpoint}",
            f"--otlp-traces-sample-ratio={config.otlp_traces_sample_ratio}"]


def kv_events_argv(config: StackConfig, instance_index: int) -> list[str]:
    """Instance `instance_index` (start order) publishes KV events on the stack's port plus its
    index, with that index as its batches' rank (as vLLM offsets by data-parallel rank)."""
    if not config.kv_events_endpoint:
        return []
    return [f"--kv-events-endpoint={offset_endpoint_port(config.kv_events_endpoint, instance_index)}",
            f"--kv-events-rank={instance_index}"]


def instance_argv(config: StackConfig, name: str, role: str, redis_url: str,
                  ready_file: Path, num_threads: int | None = None, instance_index: int = 0) -> list[str]:
    """`python -m services.prefill|services.decode ...` for one engine instance (ports 0,
    /metrics included, gRPC and UCX fixed where `config.instance_ports` names it); `num_threads`
    (the launcher's CPU plan) else the config's; `instance_index`: its place in the stack's start
    order (its KV-event port)."""
    argv = [config.python, "-m", module_of(config, role)]
    if role != "prefill":
        argv += ["--role", role]
    ports = config.instance_ports.get(name)
    grpc_port, ucx_port = (ports.grpc_port, ports.ucx_port) if ports else (0, 0)
    argv += [
        "--instance-id", name, "--host", config.host, "--grpc-port", str(grpc_port), "--ucx-port", str(ucx_port),
        "--metrics-port", "0",
        "--redis-url", redis_url, "--ready-file", str(ready_file), "--dtype", config.dtype,
        *_model_args(config),
    ]
    if not is_wildcard(config.host):
        argv += ["--ucx-host", config.host]
    num_threads = num_threads or config.num_threads
    if num_threads is not None:
        argv += ["--num-threads", str(num_threads)]
    if config.deterministic:
        argv.append("--deterministic")
    argv += kv_events_argv(config, instance_index)
    argv += config.instance_engine_args
    return argv + tracing_argv(config) + config.extra_args.get("instance", []) + config.extra_args.get(role, [])


def gateway_argv(config: StackConfig, redis_url: str, ready_file: Path) -> list[str]:
    """`python -m services.gateway ...` on the configured host and ports (gRPC, HTTP), with
    /metrics on a free port of its own."""
    argv = [
        config.python, "-m", module_of(config, "gateway"), "--host", config.host,
        "--port", str(config.gateway_port), "--http-host", config.host,
        f"--http-port={config.gateway_http_port}", "--metrics-port", "0", "--redis-url", redis_url,
        "--ready-file", str(ready_file), *_model_args(config),
    ]
    return argv + tracing_argv(config) + config.extra_args.get("gateway", [])


def child_env(config: StackConfig) -> dict[str, str]:
    """The launcher's environment plus the stack's defaults and overrides."""
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    if config.num_threads is not None:
        env["OMP_NUM_THREADS"] = str(config.num_threads)
    env.update(config.env)
    return env
