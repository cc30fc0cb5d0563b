"""What a local stack consists of and how its children are started."""

import sys
from dataclasses import dataclass, field
from pathlib import Path

from shared.errors import ConfigurationError

from services.launcher.supervisor import RestartPolicy

DEFAULT_GATEWAY_PORT = 50051
DEFAULT_GATEWAY_HTTP_PORT = 8000
DEFAULT_HOST = "127.0.0.1"
CPU_LAYOUTS = ("auto", "disjoint", "shared")


@dataclass(frozen=True)
class InstancePorts:
    """Fixed listeners of one instance, kept across its restarts (a restarted instance comes
    back on the same address, as a pod behind a stable service address would)."""

    grpc_port: int
    ucx_port: int


@dataclass
class StackConfig:
    """A local stack: Redis, prefill + decode (or colocated) instances and one gateway; built from
    `pdserve up`'s settings (services.cli.up_command.UpSettings). Raises ConfigurationError.

    Ports are 0 (ephemeral) for every instance listener, except the instances named in
    `instance_ports`; the gateway's port is fixed (default 50051, 0 for an ephemeral one).
    `extra_args` are appended to the command line
    of every child of that kind ("gateway", "prefill", "decode", "colocated", or
    "instance" for all three instance roles).
    """

    num_prefill: int = 1
    num_decode: int = 1
    # Run `num_decode` colocated instances (prefill and decode in one engine), no prefill ones.
    colocated: bool = False
    model: str | None = None
    dtype: str = "bfloat16"
    num_threads: int | None = None
    # Every instance runs in deterministic (batch-invariant) mode (`--deterministic`).
    deterministic: bool = False
    host: str = DEFAULT_HOST
    gateway_port: int = DEFAULT_GATEWAY_PORT
    # The gateway's OpenAI-compatible HTTP API (0: an ephemeral port; negative: none).
    gateway_http_port: int = DEFAULT_GATEWAY_HTTP_PORT
    # Use this Redis instead of starting a redis-server.
    redis_url: str | None = None
    # Port of the redis-server the stack starts (None: a free one).
    redis_port: int | None = None
    # Logs and ready files go here (None: a fresh temporary folder, kept after the stop).
    run_dir: Path | None = None
    ready_timeout_s: float = 600.0
    # SIGTERM makes instances and the gateway drain (20 s by default); SIGKILL after this.
    stop_grace_s: float = 30.0
    python: str = sys.executable
    # Engine flags of every instance, before `extra_args` (which win): a KV pool and a batch the
    # size of vLLM's CPU serving defaults (256 sequences; about 3.6 GiB of KV at
    # --gpu-memory-utilization 0.15 of 24 GiB), so that a burst is prefilled and decoded 256 at
    # a time instead of waiting for room 128 at a time (docs/benchmarks.md, saturation). () =
    # the engine's defaults (1 GiB, 128), as the tests' stacks run.
    instance_engine_args: tuple[str, ...] = ("--kv-cache-memory-gb", "3", "--max-num-seqs", "256")
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    # Extra environment variables for every child (on top of the launcher's own).
    env: dict[str, str] = field(default_factory=dict)
    # Module run with `python -m` per kind ("gateway", "prefill", ...), replacing the default.
    service_modules: dict[str, str] = field(default_factory=dict)
    # CPU ids every prefill / decode (and colocated) process is pinned to (None: not pinned).
    prefill_cpus: tuple[int, ...] | None = None
    decode_cpus: tuple[int, ...] | None = None
    # CPU ids the gateway and the stack's redis-server are pinned to (None: not pinned).
    gateway_cpus: tuple[int, ...] | None = None
    # How instances without CPU lists share the host (services/launcher/cpu_plan.py): "disjoint"
    # (each its own CPUs), "shared" (all over every CPU) or "auto" (shared on CPUs with bf16
    # hardware, disjoint elsewhere: measured, docs/performance.md).
    cpu_layout: str = "auto"
    # How `supervise` restarts children that die (backoff, crash-loop limit).
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    # Deployment name the restart board is published under (as the services' --deployment).
    deployment: str = "default"
    # Every child exports OpenTelemetry traces here (--otlp-traces-endpoint; '' = off).
    otlp_traces_endpoint: str = ""
    otlp_traces_sample_ratio: float = 1.0
    # Instance k (in start order, from 0) publishes KV-cache events here with the port plus k
    # (--kv-events-endpoint; '' = none).
    kv_events_endpoint: str = ""
    # Instances (by name, e.g. "prefill-0") whose gRPC and UCX ports are fixed: restarted on the same address.
    instance_ports: dict[str, InstancePorts] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_decode < 1:
            raise ConfigurationError("num_decode", f"must be >= 1, got {self.num_decode}")
        if not self.colocated and self.num_prefill < 1:
            raise ConfigurationError("num_prefill", f"must be >= 1 without --colocated, got {self.num_prefill}")
        if not 0 <= self.gateway_port <= 65535:
            raise ConfigurationError("gateway_port", f"must be in 0..65535, got {self.gateway_port}")
        if self.cpu_layout not in CPU_LAYOUTS:
            raise ConfigurationError("cpu_layout", f"must be one of {', '.join(CPU_LAYOUTS)}, got {self.cpu_layout!r}")
        if self.gateway_http_port > 65535:
            raise ConfigurationError("gateway_http_port", f"must be <= 65535, got {self.gateway_http_port}")
        self._check_instance_ports()

    def _check_instance_ports(self) -> None:
        names = {name for name, _ in self.instance_roles()}
        for name, ports in self.instance_ports.items():
            if name not in names:
                raise ConfigurationError("instance_ports", f"no instance named {name!r} (the stack's: "
                                                           f"{', '.join(sorted(names))})")
            for port in (ports.grpc_port, ports.ucx_port):
                if not 1 <= port <= 65535:
                    raise ConfigurationError("instance_ports", f"{name}'s ports must be in 1..65535, got {ports}")

    def cpus_of(self, role: str) -> tuple[int, ...] | None:
        """The CPUs a child of this role is pinned to (colocated ones take decode's, redis the gateway's)."""
        return {"prefill": self.prefill_cpus, "decode": self.decode_cpus, "colocated": self.decode_cpus,
                "gateway": self.gateway_cpus, "redis": self.gateway_cpus}.get(role)

    def instance_roles(self) -> list[tuple[str, str]]:
        """(name, role) of every engine instance, prefill ones first."""
        if self.colocated:
            return [(f"colocated-{i}", "colocated") for i in range(self.num_decode)]
        prefill = [(f"prefill-{i}", "prefill") for i in range(self.num_prefill)]
        decode = [(f"decode-{i}", "decode") for i in range(self.num_decode)]
        return prefill + decode
