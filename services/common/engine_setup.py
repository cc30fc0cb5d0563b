"""Builds an instance's engine from its settings and starts it on its own thread."""

import asyncio
import logging
import os

import torch

from shared.config import CacheConfig, EngineConfig
from shared.core.scheduler_config import SchedulerConfig
from shared.engine.async_engine import AsyncEngine
from shared.engine.llm_engine import LLMEngine
from shared.guided.limits import GuidedLimits
from shared.memory.idle_trim import HeapTrimmer, TrimPolicy
from shared.model.cpu_budget import default_num_threads
from shared.model.cpu_runtime import ONEDNN_CACHE_CAPACITY_VARIABLE
from services.common.settings import InstanceSettings, parallel_config, speculative_config

logger = logging.getLogger(__name__)

GIB = 1 << 30


def engine_config(settings: InstanceSettings) -> EngineConfig:
    cache = CacheConfig(block_size=settings.block_size,
                        kv_cache_memory_bytes=int(settings.kv_cache_memory_gb * GIB),
                        gpu_memory_utilization=settings.gpu_memory_utilization,
                        num_blocks=settings.num_blocks or None)
    scheduler = SchedulerConfig(max_num_seqs=settings.max_num_seqs,
                                max_num_batched_tokens=settings.max_num_batched_tokens)
    guided = GuidedLimits(max_bytes=settings.max_grammar_bytes, max_nesting_depth=settings.max_grammar_nesting_depth,
                          compile_timeout_s=settings.grammar_compile_timeout_s,
                          max_cached_grammars=settings.grammar_cache_size)
    return EngineConfig(model=settings.model or None, dtype=settings.dtype, device=settings.device,
                        attention_backend=settings.attention_backend,
                        max_model_len=settings.max_model_len or None,
                        num_threads=settings.num_threads or None, seed=settings.seed,
                        deterministic=settings.deterministic,
                        cache=cache, scheduler=scheduler, speculative=speculative_config(settings), guided=guided,
                        parallel=parallel_config(settings))


def trim_policy(settings: InstanceSettings) -> TrimPolicy:
    return TrimPolicy(idle_interval_s=settings.idle_trim_interval_s,
                      busy_growth_bytes=int(settings.busy_trim_growth_mb * (1 << 20)))


async def start_engine(settings: InstanceSettings) -> AsyncEngine:
    """Load the model off the event loop (health stays NOT_SERVING meanwhile), start the engine thread."""
    os.environ[ONEDNN_CACHE_CAPACITY_VARIABLE] = str(settings.onednn_cache_capacity)  # before the model loads
    engine = await asyncio.to_thread(LLMEngine.from_config, engine_config(settings))
    async_engine = AsyncEngine(engine)
    async_engine.on_loop = HeapTrimmer(trim_policy(settings)).on_loop
    async_engine.start()
    # OpenMP thread counts are per calling thread: set it where the steps run too (the
    # default: the CPUs this process may use, affinity mask and cgroup quota).
    await async_engine.call(torch.set_num_threads, settings.num_threads or default_num_threads())
    logger.info("engine ready: %d KV blocks of %d tokens", engine.block_pool.num_blocks, engine.kv_manager.block_size)
    return async_engine
