"""EngineArgs: every setting of one engine, flat, and `create_engine_config()`, which builds the
engine's config objects (EngineConfig and its sections) from them. The one way to build an
engine's configuration:

    LLM(model=..., dtype=..., **kwargs)    -> EngineArgs.from_kwargs(...)     (shared.engine.llm)
    an instance's flags, PDSERVE_* variables and settings file
                                           -> InstanceSettings.engine         (services.instance.settings)
    `pdserve up`'s flags, variables and file -> UpSettings.engine (some fields, passed on to its instances)
    `pdserve offline`, `pdserve profile`, the benchmarks -> their flags are these fields' flags

Each field is documented once, in its description: the instance's `--help` shows it. A field
marked OFFLINE_ONLY is a keyword of `LLM(...)` and of the profiler only, never a flag of an
instance (it holds an object, or it is an engine experiment the services do not expose).
Zero (or "") stands for "not set" where a flag needs a number: `num_blocks=0` sizes the pool from
`kv_cache_memory_gb`, `max_model_len=0` is the model's limit, and so on (None means the same).
"""

import dataclasses
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator
from pydantic.dataclasses import dataclass

from shared.config import CacheConfig, EngineConfig
from shared.core.scheduler_config import SchedulerConfig
from shared.errors import ConfigurationError
from shared.guided.limits import GuidedLimits
from shared.kv_cache.block_hash import SUPPORTED_HASH_ALGOS
from shared.kv_events.config import KVEventsConfig
from shared.kv_events.wire import WIRE_FORMATS
from shared.kv_tier.config import KVTierConfig
from shared.kv_transfer.types import KVTransferConfig
from shared.lora.config import LoRAConfig
from shared.model.dtypes import DTYPES
from shared.parallel.config import ParallelConfig
from shared.spec_decode.config import SpeculativeConfig

GIB = 1 << 30
# The weights' and KV cache's dtype names (shared.model.dtypes maps them to torch dtypes).
DTYPE_NAMES = tuple(DTYPES)
# json_schema_extra of a field that is an LLM(...) keyword only: no flag, variable or file key.
OFFLINE_ONLY = {"setting": "offline only"}
# max_prefill_chunk_tokens' "the role's default" (services resolve it; offline it is 0).
ROLE_DEFAULT_CHUNK = -1
# A decode instance's prompt chunk per step: small, so that its running decodes' steps grow by
# little while it prefills a prompt locally (about 0.1 s per step at 1.5 ms a token, fp32 CPU).
DECODE_PREFILL_CHUNK_TOKENS = 64
# Names the engine's config sections give some settings, still accepted by LLM(...) and
# from_kwargs: old name -> (field, conversion of the value).
ALIASES = {
    "kv_cache_memory_bytes": ("kv_cache_memory_gb", lambda num_bytes: num_bytes / GIB),
    "long_prefill_token_threshold": ("max_prefill_chunk_tokens", None),
    "max_bytes": ("max_grammar_bytes", None),
    "max_nesting_depth": ("max_grammar_nesting_depth", None),
    "compile_timeout_s": ("grammar_compile_timeout_s", None),
    "max_cached_grammars": ("grammar_cache_size", None),
}


def _arg(default, help_text: str, **constraints):
    return Field(default=default, description=help_text, **constraints)


def _offline(default, help_text: str):
    return Field(default=default, description=help_text, json_schema_extra=OFFLINE_ONLY)


@dataclass(frozen=True, config=ConfigDict(extra="forbid", arbitrary_types_allowed=True))
class EngineArgs:
    model: str = _arg("", "HF folder or .gguf file ('' = the packaged SmolLM2 model)")
    dtype: Literal[DTYPE_NAMES] = _arg("bfloat16", "weights and KV cache dtype: bfloat16 or float32")
    device: str = _arg("auto", "where the engine runs: auto (CUDA when available), cpu, cuda or cuda:N")
    gpu_memory_utilization: float = _arg(0.9, "on a GPU: share of its memory this instance may use "
                                              "(weights + KV pool; replaces --kv-cache-memory-gb)", gt=0, le=1)
    attention_backend: str = _arg("auto", "paged attention: auto (triton on CUDA, torch on CPU), torch or triton")
    num_threads: int = _arg(0, "torch intra-op threads (0 = the CPUs this process may use: affinity mask, "
                               "cgroup quota)", ge=0)
    kv_cache_memory_gb: float = _arg(1.0, "memory for the KV block pool, GiB", gt=0)
    num_blocks: int = _arg(0, "KV blocks; overrides --kv-cache-memory-gb when > 0", ge=0)
    block_size: int = _arg(16, "tokens per KV block (registered in Redis: gateways pair only instances that agree)",
                           gt=0)
    prefix_hash_algo: Literal[SUPPORTED_HASH_ALGOS] = _arg(
        "sha256", "prefix-cache block hash: sha256, blake2b or sha256_cbor (vLLM's, which indexers outside "
                  "pdserve reproduce; seeded by PYTHONHASHSEED) (registered in Redis: gateways hash prompts the "
                  "same way)")
    max_model_len: int = _arg(0, "longest sequence (0 = the model's limit)", ge=0)
    max_num_seqs: int = _arg(128, "most sequences running (or reserved) at once", gt=0)
    max_num_batched_tokens: int = _arg(2048, "most tokens computed by one engine step", gt=0)
    max_num_partial_prefills: int = _arg(4, "most prompts sharing one engine step's budget (the first to arrive; "
                                            "later ones wait their turn, a short one gets in beside them)", gt=0)
    max_prefill_chunk_tokens: int = _arg(
        ROLE_DEFAULT_CHUNK, "most prompt tokens of one request computed per engine step (chunked prefill); -1 = the "
                            f"role's default: {DECODE_PREFILL_CHUNK_TOKENS} on decode instances (local prefills share "
                            "steps with the running decodes), 0 (the step's budget) on the others", ge=-1)
    seed: int = _arg(0, "global sampling seed for unseeded requests")
    deterministic: bool = _arg(False, "batch-invariant computation (CPU): greedy output identical alone or in any "
                                      "batch, with prefix hits or chunking, and to the offline engine")
    max_grammar_bytes: int = _arg(64 * 1024, "longest guided schema, regex or grammar (bytes)")
    max_grammar_nesting_depth: int = _arg(64, "deepest bracket nesting of a guided constraint")
    grammar_compile_timeout_s: float = _arg(10.0, "longest a guided constraint may take to compile")
    grammar_cache_size: int = _arg(256, "compiled guided constraints kept (least recently used dropped)")
    enable_lora: bool = _arg(False, "serve LoRA adapters (implied by --lora-modules; adapters can then be loaded "
                                    "at run time)")
    max_loras: int = _arg(4, "most distinct LoRA adapters in one engine step", gt=0)
    max_lora_rank: int = _arg(16, "highest LoRA adapter rank accepted", gt=0)
    max_cpu_loras: int = _arg(0, "LoRA adapters kept loaded in memory, least recently used dropped "
                                 "(0 = twice --max-loras)", ge=0)
    speculative_method: str = _arg("none", "speculative decoding: none, ngram (prompt lookup) or draft (a draft "
                                           "model); decode and colocated roles only")
    num_speculative_tokens: int = _arg(3, "tokens proposed per request and step (k)")
    draft_model: str = _arg("", "draft model HF folder sharing the tokenizer ('' = the target truncated to "
                                       "--draft-num-layers)")
    draft_num_layers: int = _arg(0, "keep the draft's first N layers (0 = all of --draft-model)", ge=0)
    tensor_parallel_size: int = _arg(1, "ranks sharing each layer (worker processes; must divide the attention "
                                        "and KV heads)")
    pipeline_parallel_size: int = _arg(1, "pipeline stages (worker processes)")
    kv_events_endpoint: str = _arg("", "publish KV-cache events (vLLM's format) on a ZeroMQ PUB socket here, e.g. "
                                       "tcp://*:5557 ('' = none; `pdserve up` gives instance k port +k)")
    kv_events_topic: str = _arg("", "first frame of every KV-event message (llm-d reads kv@<pod>@<model>)")
    kv_events_format: Literal[WIRE_FORMATS] = _arg("array", "KV-event layout: array (vLLM up to 0.10, llm-d) or map "
                                                            "(vLLM 0.11 and later)")
    kv_events_rank: int = _arg(0, "the KV-event batches' data_parallel_rank (`pdserve up`: the instance's start "
                                  "order)", ge=0)
    # LLM(...) keywords only (see the module docstring).
    enable_prefix_caching: bool = _offline(True, "reuse the KV blocks of earlier prompts' prefixes")
    enable_chunked_prefill: bool = _offline(True, "split long prompts across steps")
    fair_prefill: bool = _offline(True, "prompts in one step share its budget equally (False: first come)")
    ngram_min: int = _offline(1, "ngram speculation: shortest suffix n-gram looked up")
    ngram_max: int = _offline(4, "ngram speculation: longest suffix n-gram looked up")
    num_compile_threads: int = _offline(2, "threads compiling guided-decoding grammars")
    worker_step_timeout_s: float = _offline(300.0, "seconds a step may take on parallel workers before they "
                                                   "count as hung")
    kv_transfer: KVTransferConfig | None = _offline(None, "the KV connector (None: none)")
    kv_tier: KVTierConfig | None = _offline(None, "the KV tiers below the block pool (None: none)")

    @field_validator("num_threads", "num_blocks", "max_model_len", "max_cpu_loras", "draft_num_layers",
                     mode="before")
    @classmethod
    def _none_is_zero(cls, value: Any) -> Any:
        return 0 if value is None else value

    @field_validator("model", "draft_model", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return "" if value is None else value

    def __post_init__(self) -> None:
        self.create_engine_config()  # the sections check what involves several fields

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineArgs":
        """Keyword arguments (LLM style; the ALIASES too) -> EngineArgs; ConfigurationError naming
        the first unknown or bad one."""
        values = {}
        for name, value in kwargs.items():
            if name in ALIASES:
                name, convert = ALIASES[name]
                value = value if convert is None else convert(value)
            values[name] = value
        unknown = [name for name in values if name not in cls.field_names()]
        if unknown:
            raise ConfigurationError(unknown[0], "is not an engine setting")
        try:
            return cls(**values)
        except ValidationError as error:
            raise configuration_error(error) from None

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def setting_names(cls) -> tuple[str, ...]:
        """The fields that are also an instance's flags, variables and settings-file keys."""
        return tuple(name for name, info in cls.__pydantic_fields__.items() if info.json_schema_extra != OFFLINE_ONLY)

    def create_engine_config(self) -> EngineConfig:
        """The engine's config objects; ConfigurationError naming the setting when the sections
        refuse a combination (a speculative method without its draft, a LoRA cache below
        max_loras, a parallel size below 1)."""
        lora = LoRAConfig(enable_lora=self.enable_lora, max_loras=self.max_loras, max_lora_rank=self.max_lora_rank,
                          max_cpu_loras=self.max_cpu_loras or None)
        lora.validate()
        return EngineConfig(
            model=self.model or None, dtype=self.dtype, device=self.device, attention_backend=self.attention_backend,
            max_model_len=self.max_model_len or None, num_threads=self.num_threads or None, seed=self.seed,
            deterministic=self.deterministic, cache=self._cache_config(), scheduler=self._scheduler_config(),
            speculative=self._speculative_config(), parallel=self._parallel_config(), guided=self._guided_limits(),
            kv_transfer=self.kv_transfer, kv_tier=self.kv_tier, lora=lora, kv_events=self._kv_events_config())

    def _kv_events_config(self) -> KVEventsConfig | None:
        if not self.kv_events_endpoint:
            return None
        return KVEventsConfig(self.kv_events_endpoint, self.kv_events_topic, self.kv_events_rank,
                              wire_format=self.kv_events_format)

    def _cache_config(self) -> CacheConfig:
        return CacheConfig(block_size=self.block_size, kv_cache_memory_bytes=int(self.kv_cache_memory_gb * GIB),
                           gpu_memory_utilization=self.gpu_memory_utilization, num_blocks=self.num_blocks or None,
                           enable_prefix_caching=self.enable_prefix_caching, prefix_hash_algo=self.prefix_hash_algo)

    def _scheduler_config(self) -> SchedulerConfig:
        chunk = 0 if self.max_prefill_chunk_tokens == ROLE_DEFAULT_CHUNK else self.max_prefill_chunk_tokens
        return SchedulerConfig(max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                               enable_chunked_prefill=self.enable_chunked_prefill,
                               long_prefill_token_threshold=chunk, fair_prefill=self.fair_prefill,
                               max_num_partial_prefills=self.max_num_partial_prefills)

    def _speculative_config(self) -> SpeculativeConfig:
        return SpeculativeConfig(speculative_method=self.speculative_method,
                                 num_speculative_tokens=self.num_speculative_tokens,
                                 draft_model=self.draft_model or None, draft_num_layers=self.draft_num_layers or None,
                                 ngram_max=self.ngram_max, ngram_min=self.ngram_min)

    def _parallel_config(self) -> ParallelConfig:
        return ParallelConfig(tensor_parallel_size=self.tensor_parallel_size,
                              pipeline_parallel_size=self.pipeline_parallel_size,
                              worker_step_timeout_s=self.worker_step_timeout_s)

    def _guided_limits(self) -> GuidedLimits:
        return GuidedLimits(max_bytes=self.max_grammar_bytes, max_nesting_depth=self.max_grammar_nesting_depth,
                            compile_timeout_s=self.grammar_compile_timeout_s,
                            max_cached_grammars=self.grammar_cache_size, num_compile_threads=self.num_compile_threads)


def configuration_error(error: ValidationError) -> ConfigurationError:
    """pydantic's first complaint about EngineArgs as a ConfigurationError naming the field."""
    first = error.errors(include_url=False)[0]
    field = str(first["loc"][0]) if first["loc"] else "EngineArgs"
    message = first["msg"].removeprefix("Value error, ")
    return ConfigurationError(field, f"{message}, got {first['input']!r}")
