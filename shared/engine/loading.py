"""Builds what an engine needs from its config: model, tokenizer, KV cache, executor."""

import logging
import time
from functools import partial
from pathlib import Path

import torch

from shared.config import EngineConfig
from shared.engine.device import kv_cache_memory_bytes, make_attention_backend, resolve_device
from shared.errors import ConfigurationError
from shared.executor.in_process import InProcessExecutor
from shared.executor.lora_slots import AdapterSlots
from shared.kv_cache.layout import KVCacheLayout, num_blocks_for_budget
from shared.lora.batch_invariant import RowTiledLoRALinear, probe_deltas
from shared.lora.config import LoRAConfig
from shared.lora.layers import StepAdapters, attach_lora
from shared.model.config import ModelConfig
from shared.model.default_model import resolve_model
from shared.model.batch_invariance import make_batch_invariant
from shared.model.describe_paths import describe_model, expected_cpu_paths
from shared.model.dtypes import parse_dtype
from shared.model.cpu_budget import default_num_threads
from shared.native.cpu_info import describe_cpu
from shared.model.loader import load_model
from shared.spec_decode.builder import build_speculator, draft_model_config

logger = logging.getLogger(__name__)

def build_engine_parts(config: EngineConfig):
    """(model_config, executor, tokenizer, model_key) for LLMEngine."""
    dtype = parse_dtype(config.dtype)
    device = resolve_device(config.device)
    _check_device_features(config, device)
    _check_lora_combinations(config)
    folder = resolve_model(config.model)
    if config.parallel.is_parallel:
        return build_parallel_engine_parts(config, folder, dtype, device)
    torch.set_num_threads(config.num_threads or default_num_threads())
    torch.manual_seed(config.seed)
    started = time.perf_counter()
    backend = make_attention_backend(config.attention_backend, device, ModelConfig.from_folder(folder),
                                     config.deterministic)
    lora = config.lora if config.lora.enable_lora else None
    model, model_config = load_model(folder, dtype, device=device, attn_backend=backend,
                                     deterministic=config.deterministic, fuse_mlp=lora is None)
    adapters = None
    if lora is not None:
        adapters = _attach_adapters(model, model_config, lora, device, dtype, config.deterministic)
    if config.deterministic:
        make_batch_invariant(model, config.scheduler.max_num_batched_tokens)
    tokenizer = load_tokenizer_if_present(folder)
    draft_config = draft_model_config(config.speculative, folder)
    layout = kv_cache_layout(config, model_config, dtype, draft_config, kv_cache_memory_bytes(config, device))
    max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                        model_config.max_position_embeddings)
    speculator = build_speculator(config.speculative, folder, model_config, layout, max_model_len)
    executor = InProcessExecutor(model, layout, speculator, device, adapters)
    executor.compute_paths = describe_model(model, layout.block_size)
    logger.info("loaded %s (%s on %s) in %.2fs; KV cache %d blocks of %d tokens; %s; %s", folder, config.dtype,
                device, time.perf_counter() - started, layout.num_blocks, layout.block_size,
                executor.compute_paths.summary(), describe_cpu())
    return model_config, executor, tokenizer, str(folder.name)


def _attach_adapters(model, model_config: ModelConfig, lora: LoRAConfig, device: torch.device, dtype: torch.dtype,
                     deterministic: bool) -> AdapterSlots:
    """LoRA layers on every projection: batch-invariant ones in deterministic mode (probed on this
    CPU), Triton kernels on a GPU, torch ops otherwise."""
    step = StepAdapters()
    if deterministic:
        probe_deltas(model_config, lora.max_lora_rank, device)
        layer_class = partial(RowTiledLoRALinear, pad_rank=lora.max_lora_rank)
        layers = attach_lora(model, step, lora.max_loras, layer_class=layer_class)
    else:
        triton_max_rank = lora.max_lora_rank if device.type == "cuda" else 0  # the GPU runs Triton kernels
        layers = attach_lora(model, step, lora.max_loras, triton_max_rank)
    return AdapterSlots(layers, step, lora, device, dtype)


def _check_lora_combinations(config: EngineConfig) -> None:
    """LoRA with what it does not work with yet is refused, never silently wrong."""
    if not config.lora.enable_lora:
        return
    config.lora.validate()
    if config.speculative.is_enabled:
        raise ConfigurationError("speculative_method", f"{config.speculative.speculative_method!r} cannot be combined "
                                 "with enable_lora: speculative decoding with LoRA adapters is not supported; serve "
                                 "adapters without speculation, or speculate on an engine without adapters")


def _check_device_features(config: EngineConfig, device: torch.device) -> None:
    if device.type != "cpu" and config.speculative.is_enabled:
        raise ConfigurationError("speculative_method", f"speculative decoding runs on the CPU only so far, "
                                                        f"not on {device}")


def build_parallel_engine_parts(config: EngineConfig, folder: Path, dtype: torch.dtype, device: torch.device):
    """Like build_engine_parts, with the model in one worker process per rank."""
    from shared.executor.multiproc import MultiProcExecutor
    if device.type != "cpu":
        raise ConfigurationError("tensor_parallel_size", f"parallel workers run on the CPU only so far, "
                                                          f"not on {device}")
    if config.speculative.is_enabled:
        raise ConfigurationError("speculative_method", "is not supported with tensor or pipeline parallelism")
    if config.deterministic:
        raise ConfigurationError("deterministic", "is not supported with tensor or pipeline parallelism")
    model_config = ModelConfig.from_folder(folder)
    config.parallel.check_model(model_config.num_heads, model_config.num_kv_heads, model_config.num_layers)
    layout = kv_cache_layout(config, model_config, dtype)
    started = time.perf_counter()
    lora = config.lora if config.lora.enable_lora else None
    executor = MultiProcExecutor(str(folder), layout, config.parallel, config.num_threads, config.seed, lora)
    tp = config.parallel.tensor_parallel_size
    executor.compute_paths = expected_cpu_paths(model_config.num_heads // tp, model_config.num_kv_heads // tp,
                                                model_config.head_dim, dtype, layout.block_size)
    logger.info("started %d workers (tensor parallel %d x pipeline parallel %d) for %s in %.2fs; "
                "KV cache %d blocks of %d tokens; %s", config.parallel.world_size,
                config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size, folder,
                time.perf_counter() - started, layout.num_blocks, layout.block_size, executor.compute_paths.summary())
    return model_config, executor, load_tokenizer_if_present(folder), str(folder.name)


def kv_cache_layout(config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype,
                    draft_config: ModelConfig | None = None, memory_bytes: int | None = None) -> KVCacheLayout:
    """The target's layout; with a draft model the memory budget pays for both KV tensors
    (same num_blocks, the draft's own layers and heads)."""
    probe = KVCacheLayout(model_config.num_layers, 1, config.cache.block_size,
                          model_config.num_kv_heads, model_config.head_dim, dtype)
    bytes_per_block = probe.bytes_per_block
    if draft_config is not None:
        bytes_per_block += KVCacheLayout(draft_config.num_layers, 1, config.cache.block_size,
                                         draft_config.num_kv_heads, draft_config.head_dim, dtype).bytes_per_block
    if memory_bytes is None:
        memory_bytes = config.cache.kv_cache_memory_bytes
    num_blocks = config.cache.num_blocks or num_blocks_for_budget(memory_bytes, bytes_per_block)
    if num_blocks < 1:
        raise ConfigurationError("kv_cache_memory_bytes", "too small for a single KV block")
    return KVCacheLayout(model_config.num_layers, num_blocks, config.cache.block_size,
                         model_config.num_kv_heads, model_config.head_dim, dtype)


def load_tokenizer_if_present(folder: Path):
    if not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from shared.tokenization.tokenizer import load_tokenizer
    return load_tokenizer(folder)
