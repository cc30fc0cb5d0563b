"""The composition root: builds an instance's engine from its settings (its KV connector by
role) and starts it behind the engine API, in an engine-core child process (default) or on a
thread; and the engine `pdserve profile` times, behind its probe. The one module of services/
that imports the engine implementation (pyproject.toml, contract "services-use-the-engine-api")."""

import asyncio
import dataclasses
import logging
import os
from typing import TYPE_CHECKING

from shared.config import EngineConfig
from shared.engine.async_engine import AsyncEngine
from shared.engine.core_process.client import CoreProcessClient
from shared.engine.llm_engine import LLMEngine
from shared.engine.loading import load_tokenizer_if_present
from shared.engine_api.client import EngineClient
from shared.engine_api.probe import EngineProbe
from shared.engine_args import EngineArgs
from shared.kv_tier.config import KVTierConfig
from shared.kv_tier.cost_seeds import CostSeeds, load_cost_seeds
from shared.kv_tier.sizing import default_host_tier_bytes
from shared.kv_transfer.types import KVConnectorRole, KVTransferConfig
from shared.memory.idle_trim import HeapTrimmer, TrimPolicy
from shared.model.cpu_budget import default_num_threads
from shared.model.cpu_runtime import ONEDNN_CACHE_CAPACITY_VARIABLE
from shared.model.default_model import resolve_model
from services.instance.settings import InstanceSettings

if TYPE_CHECKING:
    from shared.engine.llm import LLM

logger = logging.getLogger(__name__)

GIB = 1 << 30
MIB = 1 << 20
UCX_CONNECTOR = "shared.kv_transfer.ucx.connector:UCXConnector"
CONNECTOR_ROLES = {"prefill": KVConnectorRole.PRODUCER, "decode": KVConnectorRole.CONSUMER,
                   "colocated": KVConnectorRole.BOTH}


def kv_transfer_config(settings: InstanceSettings) -> KVTransferConfig | None:
    """The UCX connector, in the role's direction (None for a role that moves no KV); both
    directions with peer reuse (a prefill instance receives prefixes it pulls, any instance
    sends prefixes it holds)."""
    role = CONNECTOR_ROLES.get(settings.role)
    if role is None:
        return None
    if settings.kv_peer_reuse:
        role = KVConnectorRole.BOTH
    return KVTransferConfig(UCX_CONNECTOR, role, host=settings.ucx_host, port=settings.ucx_port,
                            max_staging_bytes=int(settings.kv_staging_max_mb * MIB),
                            send_wait_s=settings.kv_send_wait_ms / 1e3,
                            transfer_timeout_s=settings.kv_transfer_timeout_s)


def engine_config(settings: InstanceSettings) -> EngineConfig:
    """The instance's EngineArgs (its role's choices resolved) with its KV connector and tiers."""
    args = dataclasses.replace(settings.role_engine_args(), kv_transfer=kv_transfer_config(settings),
                               kv_tier=kv_tier_config(settings))
    return args.create_engine_config()


def kv_tier_config(settings: InstanceSettings) -> KVTierConfig | None:
    """The host and file tiers below the pool (None when both are off), their load costs and
    the prefill cost seeded from --kv-cost-profile when given."""
    host_bytes = (int(settings.kv_host_tier_gb * GIB) if settings.kv_host_tier_gb >= 0
                  else default_host_tier_bytes(settings.kv_host_tier_dir))
    file_bytes = int(settings.kv_file_tier_gb * GIB)
    if host_bytes <= 0 and file_bytes <= 0:
        return None
    seeds = load_cost_seeds(settings.kv_cost_profile) if settings.kv_cost_profile else CostSeeds({}, None)

    def per_block(tier: str) -> float | None:
        return seeds.tiers[tier].seconds_per_block if tier in seeds.tiers else None

    return KVTierConfig(host_bytes=max(0, host_bytes), host_dir=settings.kv_host_tier_dir, file_bytes=file_bytes,
                        file_dir=settings.kv_file_tier_dir, write_through=settings.kv_tier_write_through,
                        host_load_seconds_per_block=per_block("host"), file_load_seconds_per_block=per_block("file"),
                        compute_seconds_per_token=seeds.compute_seconds_per_token)


async def start_engine(settings: InstanceSettings) -> EngineClient:
    """Load the model off the event loop (health stays NOT_SERVING meanwhile) and start the
    engine core: in a child process (`--engine-core process`) or on a thread of this one."""
    os.environ[ONEDNN_CACHE_CAPACITY_VARIABLE] = str(settings.onednn_cache_capacity)  # before the model loads
    config = engine_config(settings)
    if settings.engine_core == "process":
        client = await start_core_process(settings, config)
    else:
        client = await start_engine_thread(settings, config)
    logger.info("engine ready: %d KV blocks of %d tokens", client.info.num_blocks, client.info.cache.block_size)
    return client


async def start_engine_thread(settings: InstanceSettings, config: EngineConfig) -> AsyncEngine:
    engine = await asyncio.to_thread(LLMEngine.from_config, config)
    on_loop = HeapTrimmer(trim_policy(settings)).on_loop
    # OpenMP thread counts are per calling thread: the engine thread sets it (the default: the
    # CPUs this process may use, affinity mask and cgroup quota).
    client = AsyncEngine(engine, on_loop=on_loop, num_threads=settings.engine.num_threads or default_num_threads())
    await client.start()
    return client


async def start_core_process(settings: InstanceSettings, config: EngineConfig) -> CoreProcessClient:
    """The model folder is resolved here (a GGUF converted once) so that the core loads the
    same folder; this process keeps the tokenizer for detokenization and stop strings."""
    folder = await asyncio.to_thread(resolve_model, config.model)
    # The core's step loop runs on its main thread with this many OpenMP threads (the default:
    # the CPUs this process, and so the core, may use).
    config = dataclasses.replace(config, model=str(folder), num_threads=config.num_threads or default_num_threads())
    tokenizer = await asyncio.to_thread(load_tokenizer_if_present, folder)
    client = CoreProcessClient(config, tokenizer, trim_policy=trim_policy(settings))
    await client.start()
    return client


def trim_policy(settings: InstanceSettings) -> TrimPolicy:
    return TrimPolicy(idle_interval_s=settings.idle_trim_interval_s,
                      busy_growth_bytes=int(settings.busy_trim_growth_mb * (1 << 20)))


def build_engine_probe(args: EngineArgs, with_kv_transport: bool = True) -> EngineProbe:
    """An engine built like a serving instance's (from the same EngineArgs), behind the probe
    `pdserve profile` times it through; its KV sends over UCX on loopback unless
    `with_kv_transport` is False (a busy neighbour sends nothing)."""
    from shared.engine.probe import StepProbe
    from shared.kv_transfer.ucx.loopback_timing import time_loopback_sends

    engine = LLMEngine.from_config(args.create_engine_config())
    return StepProbe(engine, time_loopback_sends if with_kv_transport else None)


def build_offline_llm(args: EngineArgs) -> "LLM":
    """The offline engine `pdserve offline` generates with."""
    from shared.engine.llm import LLM

    return LLM.from_engine_args(args)
