"""What a tensor/pipeline-parallel worker is told when it starts: typed msgspec bytes on its
stdin (only these types decode; nothing is pickled).

The worker derives its KV shard from the engine's full cache layout, its rank and the shard
folder (kv_shards.shard_of_rank), so only the layout travels.
"""

import msgspec
import torch

from shared.kv_cache.layout import KVCacheLayout
from shared.lora.config import LoRAConfig

# (shared-memory name, readers, slots, slot bytes): what ShmRing.attach takes.
RingSpec = tuple[str, int, int, int]


class StartupError(RuntimeError):
    """The bytes on a worker's stdin are not a WorkerStartup."""


class CacheLayout(msgspec.Struct, frozen=True):
    """KVCacheLayout on the wire (its dtype by name)."""
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str

    @classmethod
    def of(cls, layout: KVCacheLayout) -> "CacheLayout":
        return cls(layout.num_layers, layout.num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim,
                   dtype_name(layout.dtype))

    def to_layout(self) -> KVCacheLayout:
        return KVCacheLayout(self.num_layers, self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim,
                             dtype_from_name(self.dtype))


class AdapterSettings(msgspec.Struct, frozen=True):
    """LoRAConfig on the wire: the worker wraps its shard's projections in LoRA layers."""
    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int | None

    @classmethod
    def of(cls, config: LoRAConfig | None) -> "AdapterSettings | None":
        return None if config is None else cls(config.max_loras, config.max_lora_rank, config.max_cpu_loras)

    def to_config(self) -> LoRAConfig:
        return LoRAConfig(True, self.max_loras, self.max_lora_rank, self.max_cpu_loras)


class WorkerStartup(msgspec.Struct, frozen=True):
    rank: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    engine_pid: int          # the worker exits when this process is gone
    store_port: int          # the engine's torch.distributed TCP store on 127.0.0.1
    model_folder: str
    kv_layout: CacheLayout   # the engine's full cache; the worker keeps its shard of it
    kv_folder: str
    num_threads: int
    seed: int
    step_ring: RingSpec
    reply_ring: RingSpec
    lora: AdapterSettings | None = None  # None: no LoRA

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise StartupError(f"kv_layout.dtype: {name!r} is not a torch dtype")
    return dtype


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(WorkerStartup)


def encode_startup(startup: WorkerStartup) -> bytes:
    return _encoder.encode(startup)


def decode_startup(payload: bytes) -> WorkerStartup:
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as error:
        raise StartupError(f"not a worker startup message: {error}") from error
