"""InstanceSettings: every setting of an engine instance, each a CLI flag and a PDSERVE_* variable.

Flag `--kv-cache-memory-gb` is variable `PDSERVE_KV_CACHE_MEMORY_GB`, and so on for every
field below. Precedence: flag, then environment variable, then the documented default.

Default gRPC ports (used by `make run`; tests pass 0 for an ephemeral port and read the
bound address from `--ready-file`): prefill 50052, decode 50053, colocated 50054. The UCX
receiver port defaults to 0 (ephemeral); its address is registered in Redis. The Prometheus
`/metrics` listener is off unless --metrics-port is given (0 = a free port, announced in the
log and the ready file).
"""

from dataclasses import dataclass, field, fields

from shared.cluster.instance_records import ROLES
from shared.cluster.keys import validate_name
from shared.engine.loading import DTYPES
from shared.errors import InvalidRequestError
from shared.parallel.config import ParallelConfig
from shared.spec_decode.config import SpeculativeConfig
from shared.logging_setup import LOG_FORMATS

DEFAULT_GRPC_PORTS = {"prefill": 50052, "decode": 50053, "colocated": 50054}
ROLE_DEFAULT_PORT = -1  # grpc_port sentinel: the role's documented default


def _setting(default, help_text: str):
    return field(default=default, metadata={"help": help_text})


@dataclass
class InstanceSettings:
    role: str = _setting("decode", "instance role: prefill, decode or colocated")
    model: str = _setting("", "HF folder or .gguf file ('' = the packaged SmolLM2 model)")
    served_model_name: str = _setting("", "model name in the Redis keys ('' = the model folder's name; "
                                          "must match the gateway's)")
    dtype: str = _setting("bfloat16", "weights and KV cache dtype: bfloat16 or float32")
    device: str = _setting("auto", "where the engine runs: auto (CUDA when available), cpu, cuda or cuda:N")
    gpu_memory_utilization: float = _setting(0.9, "on a GPU: share of its memory this instance may use "
                                                  "(weights + KV pool; replaces --kv-cache-memory-gb)")
    attention_backend: str = _setting("auto", "paged attention: auto (triton on CUDA, torch on CPU), "
                                              "torch or triton")
    host: str = _setting("127.0.0.1", "address the gRPC server binds")
    advertise_host: str = _setting("", "host put in the registered gRPC address ('' = --host, "
                                       "or this machine's hostname when --host is a wildcard)")
    grpc_port: int = _setting(ROLE_DEFAULT_PORT, "gRPC port (0 = ephemeral; -1 = the role's default: "
                                                  "prefill 50052, decode 50053, colocated 50054)")
    ucx_host: str = _setting("127.0.0.1", "host advertised for the UCX KV receiver")
    ucx_port: int = _setting(0, "UCX KV receiver port (0 = ephemeral)")
    metrics_port: int = _setting(-1, "Prometheus /metrics port on --host (0 = a free one; -1 = none)")
    redis_url: str = _setting("redis://127.0.0.1:6379/0", "Redis holding the cluster state")
    deployment: str = _setting("default", "deployment name; namespaces the Redis keys")
    instance_id: str = _setting("", "instance id in Redis ('' = generated from role and a random suffix)")
    num_threads: int = _setting(0, "torch intra-op threads (0 = the CPUs this process may use: affinity mask, cgroup quota)")
    kv_cache_memory_gb: float = _setting(1.0, "memory for the KV block pool, GiB")
    num_blocks: int = _setting(0, "KV blocks; overrides --kv-cache-memory-gb when > 0")
    block_size: int = _setting(16, "tokens per KV block (must match across the deployment)")
    max_model_len: int = _setting(0, "longest sequence (0 = the model's limit)")
    max_num_seqs: int = _setting(128, "most sequences running (or reserved) at once")
    max_num_batched_tokens: int = _setting(2048, "most tokens computed by one engine step")
    seed: int = _setting(0, "global sampling seed for unseeded requests")
    deterministic: bool = _setting(False, "batch-invariant computation (CPU): greedy output identical alone or "
                                          "in any batch, with prefix hits or chunking, and to the offline engine")
    max_grammar_bytes: int = _setting(64 * 1024, "longest guided schema, regex or grammar (bytes)")
    max_grammar_nesting_depth: int = _setting(64, "deepest bracket nesting of a guided constraint")
    grammar_compile_timeout_s: float = _setting(10.0, "longest a guided constraint may take to compile")
    grammar_cache_size: int = _setting(256, "compiled guided constraints kept (least recently used dropped)")
    speculative_method: str = _setting("none", "speculative decoding: none, ngram (prompt lookup) or draft "
                                               "(a draft model); decode and colocated roles only")
    num_speculative_tokens: int = _setting(3, "tokens proposed per request and step (k)")
    draft_model: str = _setting("", "draft model HF folder sharing the tokenizer ('' = the target "
                                    "truncated to --draft-num-layers)")
    draft_num_layers: int = _setting(0, "keep the draft's first N layers (0 = all of --draft-model)")
    tensor_parallel_size: int = _setting(1, "ranks sharing each layer (worker processes; must divide the "
                                             "attention and KV heads)")
    pipeline_parallel_size: int = _setting(1, "pipeline stages (worker processes)")
    heartbeat_interval_s: float = _setting(1.0, "seconds between registry heartbeats")
    heartbeat_ttl_s: float = _setting(5.0, "registry entry TTL; a silent instance drops out after it")
    lease_ms: int = _setting(10_000, "default reservation lease when Reserve asks for 0")
    prefix_publish_interval_s: float = _setting(0.15, "seconds between prefix-index updates")
    drain_timeout_s: float = _setting(20.0, "on SIGTERM, seconds to finish accepted work (prefills, granted "
                                            "reservations, running decodes) before stopping")
    shutdown_grace_s: float = _setting(5.0, "seconds in-flight RPCs get to finish after the drain")
    ready_file: str = _setting("", "write {grpc_address, ucx_address, instance_id, role} JSON here once serving")
    kv_staging_max_mb: float = _setting(128.0, "free KV-transfer staging buffers kept for reuse, MiB "
                                               "(sender and receiver each)")
    onednn_cache_capacity: int = _setting(128, "entries in each of oneDNN's per-shape primitive caches")
    idle_trim_interval_s: float = _setting(10.0, "return free heap memory to the OS when the engine idles, "
                                                 "at most this often (0 = never)")
    busy_trim_growth_mb: float = _setting(64.0, "while the engine is busy, return free heap memory once the "
                                                "resident set has grown this many MiB since the last trim (0 = never)")
    log_level: str = _setting("INFO", "Python logging level")
    log_format: str = _setting("text", "log lines as plain text or one JSON object each (text, json)")
    tls_cert_file: str = _setting("", "serve gRPC over TLS with this PEM certificate ('' = plain)")
    tls_key_file: str = _setting("", "the PEM private key of --tls-cert-file")
    tls_ca_file: str = _setting("", "accept only clients with a certificate this CA signed (mutual TLS)")

    def __post_init__(self) -> None:
        validate_settings(self)

    @property
    def bound_grpc_port(self) -> int:
        """The port to bind: the flag, or the role's documented default."""
        return DEFAULT_GRPC_PORTS[self.role] if self.grpc_port == ROLE_DEFAULT_PORT else self.grpc_port


def setting_fields():
    """The dataclass fields, in flag order."""
    return fields(InstanceSettings)


def validate_settings(settings: InstanceSettings) -> None:
    """Raise InvalidRequestError naming the first bad setting."""
    if settings.role not in ROLES:
        raise InvalidRequestError("role", f"must be one of {ROLES}, got {settings.role!r}")
    if settings.dtype not in DTYPES:
        raise InvalidRequestError("dtype", f"must be one of {sorted(DTYPES)}, got {settings.dtype!r}")
    validate_name("deployment", settings.deployment)
    if settings.served_model_name:
        validate_name("served_model_name", settings.served_model_name)
    if settings.instance_id:
        validate_name("instance_id", settings.instance_id)
    if settings.log_format not in LOG_FORMATS:
        raise InvalidRequestError("log_format", f"must be one of {LOG_FORMATS}, got {settings.log_format!r}")
    for name in ("grpc_port", "ucx_port", "metrics_port"):
        low = 0 if name == "ucx_port" else -1
        if not low <= getattr(settings, name) <= 65535:
            raise InvalidRequestError(name, f"must be in [{low}, 65535], got {getattr(settings, name)}")
    if not 0 < settings.gpu_memory_utilization <= 1:
        raise InvalidRequestError("gpu_memory_utilization",
                                  f"must be in (0, 1], got {settings.gpu_memory_utilization}")
    _check_positive(settings, ("kv_cache_memory_gb", "block_size", "max_num_seqs", "max_num_batched_tokens",
                               "heartbeat_interval_s", "heartbeat_ttl_s", "lease_ms",
                               "prefix_publish_interval_s"))
    _check_non_negative(settings, ("num_threads", "num_blocks", "max_model_len", "shutdown_grace_s",
                                   "drain_timeout_s"))
    _check_non_negative(settings, ("draft_num_layers", "kv_staging_max_mb", "idle_trim_interval_s",
                                   "busy_trim_growth_mb"))
    _check_positive(settings, ("onednn_cache_capacity",))
    speculative_config(settings)
    parallel_config(settings)
    if bool(settings.tls_cert_file) != bool(settings.tls_key_file):
        raise InvalidRequestError("tls_cert_file", "tls_cert_file and tls_key_file go together")
    if settings.tls_ca_file and not settings.tls_cert_file:
        raise InvalidRequestError("tls_ca_file", "needs tls_cert_file and tls_key_file")
    if settings.heartbeat_ttl_s <= settings.heartbeat_interval_s:
        raise InvalidRequestError("heartbeat_ttl_s", f"must exceed heartbeat_interval_s "
                                                     f"({settings.heartbeat_interval_s}), "
                                                     f"got {settings.heartbeat_ttl_s}")


def parallel_config(settings: InstanceSettings) -> ParallelConfig:
    return ParallelConfig(tensor_parallel_size=settings.tensor_parallel_size,
                          pipeline_parallel_size=settings.pipeline_parallel_size)


def _check_positive(settings: InstanceSettings, names: tuple[str, ...]) -> None:
    for name in names:
        if not getattr(settings, name) > 0:
            raise InvalidRequestError(name, f"must be > 0, got {getattr(settings, name)!r}")


def _check_non_negative(settings: InstanceSettings, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(settings, name) < 0:
            raise InvalidRequestError(name, f"must be >= 0, got {getattr(settings, name)!r}")


def speculative_config(settings: InstanceSettings) -> SpeculativeConfig:
    """The engine's speculative decoding settings (prefill instances never speculate: they
    only compute the prompt and sample the first token). Raises InvalidRequestError."""
    method = "none" if settings.role == "prefill" else settings.speculative_method
    return SpeculativeConfig(speculative_method=method,
                             num_speculative_tokens=settings.num_speculative_tokens,
                             draft_model=settings.draft_model or None,
                             draft_num_layers=settings.draft_num_layers or None)
