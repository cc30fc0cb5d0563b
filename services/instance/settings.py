"""InstanceSettings: every setting of an engine instance, each a CLI flag, a PDSERVE_* variable
and a key of the optional TOML settings file (services.settings.service_settings).

Flag `--kv-cache-memory-gb` is variable `PDSERVE_KV_CACHE_MEMORY_GB` and file key
`kv_cache_memory_gb`, and so on for every field below and every field of the engine's
settings, `engine` (shared.engine_args.EngineArgs, the same model `LLM(...)` takes), which
stay flat on the command line, in the environment and in the file. Precedence: flag, then environment
variable, then settings file (`--config FILE`), then the documented default.

Default gRPC ports (used by `make run`; tests pass 0 for an ephemeral port and read the
bound address from `--ready-file`): prefill 50052, decode 50053, colocated 50054. The UCX
receiver port defaults to 0 (ephemeral); its address is registered in Redis. The Prometheus
`/metrics` listener is off unless --metrics-port is given (0 = a free one, announced in the
log and the ready file). Nor is the OpenAI-compatible HTTP API of a decode or colocated
instance (--openai-port: services.instance.openai_door).
"""

import dataclasses
from typing import Annotated, Literal


from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from shared.cluster.instance_records import ROLES
from shared.cluster.keys import validate_name
from shared.engine_args import DECODE_PREFILL_CHUNK_TOKENS, ROLE_DEFAULT_CHUNK, EngineArgs
from shared.kv_transfer.types import DEFAULT_TRANSFER_TIMEOUT_S
from shared.errors import ConfigurationError, InvalidRequestError
from shared.logging_setup import LOG_FORMATS
from shared.lora.config import LoRAConfig
from shared.lora.request import validate_adapter_name

from services.observability.tracing_setup import TracingSettings
from services.settings.flags import MANY_VALUES
from services.settings.redis_client import RedisClientSettings
from services.settings.service_settings import SETTINGS_GROUP, ServiceSettings, comma_separated

DEFAULT_GRPC_PORTS = {"prefill": 50052, "decode": 50053, "colocated": 50054}
ENGINE_CORE_PLACES = ("process", "thread")
ROLE_DEFAULT_PORT = -1  # grpc_port sentinel: the role's documented default
MAX_PORT = 65535
OPENAI_OFF = -1  # openai_port: no OpenAI HTTP API


def _setting(default, help_text: str, **constraints):
    return Field(default=default, description=help_text, **constraints)


class InstanceSettings(TracingSettings, RedisClientSettings):
    role: Literal[ROLES] = _setting("decode", "instance role: prefill, decode or colocated")
    engine: EngineArgs = Field(default_factory=EngineArgs, json_schema_extra=SETTINGS_GROUP,
                               description="the engine's settings, each a flag of its own (shared.engine_args)")
    served_model_name: str = _setting("", "model name in the Redis keys ('' = the model folder's name; "
                                          "must match the gateway's)")
    host: str = _setting("127.0.0.1", "address the gRPC server binds")
    advertise_host: str = _setting("", "host put in the registered gRPC address ('' = --host, "
                                       "or this machine's hostname when --host is a wildcard)")
    grpc_port: int = _setting(ROLE_DEFAULT_PORT, "gRPC port (0 = ephemeral; -1 = the role's default: "
                                                  "prefill 50052, decode 50053, colocated 50054)", ge=-1, le=MAX_PORT)
    ucx_host: str = _setting("127.0.0.1", "host advertised for the UCX KV receiver")
    ucx_port: int = _setting(0, "UCX KV receiver port (0 = ephemeral)", ge=0, le=MAX_PORT)
    metrics_port: int = _setting(-1, "Prometheus /metrics port on --host (0 = a free one; -1 = none)", ge=-1, le=MAX_PORT)
    openai_port: int = _setting(-1, "decode and colocated roles: serve the OpenAI-compatible HTTP API here too, "
                                    "on this port on --host, for a pod behind a Gateway API Inference Extension "
                                    "gateway; an x-gateway-prefill-endpoints header names the prefill instance "
                                    "(docs/kubernetes.md) (0 = a free one; -1 = off)", ge=-1, le=MAX_PORT)
    redis_url: str = _setting("redis://127.0.0.1:6379/0", "Redis holding the cluster state")
    deployment: str = _setting("default", "deployment name; namespaces the Redis keys")
    instance_id: str = _setting("", "instance id in Redis ('' = generated from role and a random suffix)")
    max_local_prefill_tokens: int = _setting(
        256, "decode role: most uncached prompt tokens of local prefills (conditional disaggregation) being "
             "computed at once; a local prefill beyond it is refused and goes to the prefill pool (0 = refuse all)",
        ge=0)
    lora_modules: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(), json_schema_extra=MANY_VALUES,
        description="LoRA adapters served as models, each name=path of a peft folder (adapter_config.json + "
                    "adapter_model.safetensors); several after one flag or the flag repeated; the variable and "
                    "the settings file list them comma separated")
    heartbeat_interval_s: float = _setting(1.0, "seconds between registry heartbeats", gt=0)
    heartbeat_ttl_s: float = _setting(5.0, "registry entry TTL; a silent instance drops out after it", gt=0)
    lease_ms: int = _setting(10_000, "default reservation lease when Reserve asks for 0", gt=0)
    prefix_publish_interval_s: float = _setting(0.15, "seconds between prefix-index updates", gt=0)
    drain_timeout_s: float = _setting(20.0, "on SIGTERM, seconds to finish accepted work (prefills, granted "
                                            "reservations, running decodes) before stopping", ge=0)
    shutdown_grace_s: float = _setting(5.0, "seconds in-flight RPCs get to finish after the drain", ge=0)
    # A hung gateway (stopped, not dead) leaves its TCP connections open: HTTP/2 pings find it.
    client_keepalive_s: float = _setting(10.0, "ping each caller's connection (a gateway's) after this many seconds; "
                                               "see --client-keepalive-timeout-s", gt=0)
    client_keepalive_timeout_s: float = _setting(10.0, "a caller that leaves a ping unanswered this long is hung: "
                                                       "its connection is closed and its calls cancelled, which "
                                                       "frees what they held", gt=0)
    ready_file: str = _setting("", "write {grpc_address, ucx_address, instance_id, role} JSON here once serving")
    kv_staging_max_mb: float = _setting(128.0, "free KV-transfer staging buffers kept for reuse, MiB "
                                               "(sender and receiver each)", ge=0)
    kv_send_wait_ms: float = _setting(30.0, "a prefill step that started KV sends waits up to this long for them to "
                                            "end, so those prompts are answered with it, not after the next step's "
                                            "compute (0 = never wait)", ge=0)
    kv_transfer_timeout_s: float = _setting(
        DEFAULT_TRANSFER_TIMEOUT_S, "longest one KV transfer may take, connection set-up included; a prefill "
                                    "whose send to the decode instance fails or times out answers ABORTED and the "
                                    "gateway retries the prompt on another prefill instance", gt=0)
    kv_host_tier_gb: float = _setting(-1.0, "KV host tier: shared memory for KV blocks evicted from (or finished "
                                            "in) the pools of this host's instances, which all share it, GiB (-1 = "
                                            "sized to the machine: an eighth of its memory, at most half of "
                                            "--kv-host-tier-dir's free space; 0 = off)", ge=-1)
    kv_host_tier_dir: str = _setting("/dev/shm", "where the host tier's arena file lives (a memory file system)")
    kv_file_tier_gb: float = _setting(0.0, "KV file tier below the host tier: a memory-mapped file on local disk "
                                           "that outlives the instances, GiB (0 = off)", ge=0)
    kv_file_tier_dir: str = _setting("", "where the file tier lives ('' = <pdserve cache dir>/kv-tier)")
    kv_tier_write_through: bool = _setting(True, "store a request's computed KV blocks in the tiers when it ends, "
                                                 "not only when the pool evicts them (the next turn of a chat "
                                                 "finds the decode instance's blocks there)")
    kv_peer_reuse: bool = _setting(True, "pull a prefix another instance holds over UCX instead of computing it "
                                         "(prefill), and serve such pulls (every role)")
    kv_peer_timeout_s: float = _setting(5.0, "longest a peer pull may take before the prompt is computed instead",
                                        gt=0)
    kv_cost_profile: str = _setting("", "a `pdserve profile` JSON whose measured tier, peer and prefill costs "
                                        "seed the load-or-recompute choice ('' = built-in figures until this "
                                        "instance has measured its own)")
    onednn_cache_capacity: int = _setting(128, "entries in each of oneDNN's per-shape primitive caches", gt=0)
    idle_trim_interval_s: float = _setting(10.0, "return free heap memory to the OS when the engine idles, "
                                                 "at most this often (0 = never)", ge=0)
    engine_core: Literal[ENGINE_CORE_PLACES] = _setting(
        "process", "where the engine core (scheduler + model) runs: process (a child process, restarted if it "
                   "crashes) or thread (in this process)")
    max_engine_restarts: int = _setting(3, "engine-core crashes restarted within --engine-restart-window-s; "
                                           "one more exits the instance non-zero", ge=0)
    engine_restart_window_s: float = _setting(300.0, "window of --max-engine-restarts, seconds", ge=0)
    busy_trim_growth_mb: float = _setting(64.0, "while the engine is busy, return free heap memory once the "
                                                "resident set has grown this many MiB since the last trim (0 = never)",
                                          ge=0)
    log_level: str = _setting("INFO", "Python logging level")
    log_format: Literal[LOG_FORMATS] = _setting("text", "log lines as plain text or one JSON object each (text, json)")
    tls_cert_file: str = _setting("", "serve gRPC over TLS with this PEM certificate ('' = plain)")
    tls_key_file: str = _setting("", "the PEM private key of --tls-cert-file")
    tls_ca_file: str = _setting("", "accept only clients with a certificate this CA signed (mutual TLS)")

    @field_validator("lora_modules", mode="before")
    @classmethod
    def _split_modules(cls, value):
        """PDSERVE_LORA_MODULES and the settings file may list them comma separated."""
        return comma_separated(value)

    @model_validator(mode="after")
    def _check_together(self) -> "InstanceSettings":
        """Checks that involve several settings (one value alone is checked by its field)."""
        try:
            validate_name("deployment", self.deployment)
            for name in ("served_model_name", "instance_id"):
                if getattr(self, name):
                    validate_name(name, getattr(self, name))
        except InvalidRequestError as error:
            raise ConfigurationError(error.field, error.message) from None
        parse_lora_modules(self.lora_modules)
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigurationError("tls_cert_file", "tls_cert_file and tls_key_file go together")
        if self.tls_ca_file and not self.tls_cert_file:
            raise ConfigurationError("tls_ca_file", "needs tls_cert_file and tls_key_file")
        if self.openai_port != OPENAI_OFF and self.role == "prefill":
            raise ConfigurationError("openai_port", "a prefill instance serves no OpenAI API (decode and colocated do)")
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise ConfigurationError("heartbeat_ttl_s", f"must exceed heartbeat_interval_s "
                                                        f"({self.heartbeat_interval_s}), got {self.heartbeat_ttl_s}")
        return self

    @property
    def prefill_chunk_tokens(self) -> int:
        """The per-request prompt chunk per step (0: the step's budget), the role's default resolved."""
        if self.engine.max_prefill_chunk_tokens != ROLE_DEFAULT_CHUNK:
            return self.engine.max_prefill_chunk_tokens
        return DECODE_PREFILL_CHUNK_TOKENS if self.role == "decode" else 0

    def role_engine_args(self) -> EngineArgs:
        """`engine` with what the role and the other settings decide: the prompt chunk's role
        default, no speculation on a prefill instance (it only computes the prompt and samples the
        first token), LoRA on when --lora-modules names adapters."""
        engine = self.engine
        return dataclasses.replace(
            engine, max_prefill_chunk_tokens=self.prefill_chunk_tokens,
            speculative_method="none" if self.role == "prefill" else engine.speculative_method,
            enable_lora=engine.enable_lora or bool(self.lora_modules))

    @property
    def bound_grpc_port(self) -> int:
        """The port to bind: the flag, or the role's documented default."""
        return DEFAULT_GRPC_PORTS[self.role] if self.grpc_port == ROLE_DEFAULT_PORT else self.grpc_port


def lora_config(settings: InstanceSettings) -> LoRAConfig:
    return settings.role_engine_args().create_engine_config().lora


def parse_lora_modules(modules: tuple[str, ...]) -> dict[str, str]:
    """`name=path` entries -> {name: path}; ConfigurationError naming lora_modules."""
    parsed = {}
    for module in modules:
        name, sep, path = module.partition("=")
        if not sep or not name or not path:
            raise ConfigurationError("lora_modules", f"{module!r} is not name=path")
        if name in parsed:
            raise ConfigurationError("lora_modules", f"{name!r} is given twice")
        try:
            validate_adapter_name(name)
        except InvalidRequestError as error:
            raise ConfigurationError("lora_modules", error.message) from None
        parsed[name] = path
    return parsed
