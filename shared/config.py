"""Engine settings, grouped by the component that reads them."""

from dataclasses import dataclass, field

from shared.core.scheduler_config import SchedulerConfig
from shared.guided.limits import GuidedLimits
from shared.kv_events.config import KVEventsConfig
from shared.kv_tier.config import KVTierConfig
from shared.kv_transfer.types import KVTransferConfig
from shared.lora.config import LoRAConfig
from shared.parallel.config import ParallelConfig
from shared.spec_decode.config import SpeculativeConfig

DEFAULT_BLOCK_SIZE = 16


@dataclass
class CacheConfig:
    block_size: int = DEFAULT_BLOCK_SIZE
    # Memory for the KV block pool on the CPU; the number of blocks follows from it.
    kv_cache_memory_bytes: int = 1 << 30
    # On a GPU: the share of its total memory this engine may use (weights, activations and the
    # KV pool, which gets what the weights leave), instead of kv_cache_memory_bytes.
    gpu_memory_utilization: float = 0.9
    # Overrides the memory budget when set (tests use tiny pools).
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
    # "sha256" (default), "blake2b" or "sha256_cbor" (vLLM's scheme) for the chained block hashes.
    prefix_hash_algo: str = "sha256"


@dataclass
class EngineConfig:
    # An HF Llama folder, a .gguf file, or None for the packaged default model.
    model: str | None = None
    dtype: str = "bfloat16"
    # "auto" (CUDA when available), "cpu" or "cuda" / "cuda:N" (shared/engine/device.py).
    device: str = "auto"
    # Paged attention implementation: "auto" (Triton on CUDA, torch + the C++ kernel on CPU),
    # "torch" or "triton" (on CPU only under TRITON_INTERPRET=1, for tests).
    attention_backend: str = "auto"
    # None = the model's own limit.
    max_model_len: int | None = None
    # Threads for torch's intra-op pool; None: the CPUs this process may use (affinity mask,
    # cgroup quota; shared/model/cpu_budget.py).
    num_threads: int | None = None
    seed: int = 0
    # Batch-invariant computation (CPU): greedy output and logits are the same bits alone or in
    # any batch, with or without prefix hits, chunking or speculation (docs/deterministic.md).
    deterministic: bool = False
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    # Tensor/pipeline parallelism: more than one rank runs the model in worker processes.
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    # Guided decoding: constraint size limits, compile time limit, grammar cache size.
    guided: GuidedLimits = field(default_factory=GuidedLimits)
    # The KV connector that moves prompts' KV to and from other engines (None: none).
    kv_transfer: KVTransferConfig | None = None
    # KV tiers below the block pool: host shared memory and a local file (None: none).
    kv_tier: KVTierConfig | None = None
    # LoRA adapters served beside the base model (shared.lora).
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    # Publish KV-cache events in vLLM's wire format on a ZeroMQ socket (None: none; shared.kv_events).
    kv_events: KVEventsConfig | None = None
