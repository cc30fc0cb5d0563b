"""Puts the KV tiers under an engine's block pool (EngineCore calls `attach_tiers` once), and
times the engine's prompt steps for the load-or-recompute cost model."""

import logging
import time

from shared.core.kv_cache_manager import KVCacheManager
from shared.core.scheduler_output import SchedulerOutput
from shared.kv_tier.config import KVTierConfig
from shared.kv_tier.identity import cache_fingerprint, model_files_identity
from shared.kv_tier.manager import KVTierManager

logger = logging.getLogger(__name__)


def attach_tiers(tier_config: KVTierConfig | None, kv_access, kv_manager: KVCacheManager, model: str | None,
                 deterministic: bool) -> "KVTierManager | None":
    """The tier manager wired to the pool's evictions and the prefix lookups; None when the
    config has no tier (or prefix caching is off: nothing would be found again). `model`: the
    engine's model folder or file (None: the packaged one)."""
    if tier_config is None or not tier_config.is_enabled or not kv_manager.enable_prefix_caching:
        return None
    fingerprint = cache_fingerprint(kv_manager.model_key, model_files_identity(_model_path(model)),
                                    kv_access.kv_cache_layout, kv_manager.hash_algo, deterministic)
    manager = KVTierManager(tier_config, kv_access, kv_manager.pool, fingerprint)
    kv_manager.pool.on_evict = manager.on_evicted
    kv_manager.lower_tier = manager
    logger.info("KV tiers under the pool: %s", ", ".join(
        f"{level.name} {level.arena.capacity_bytes / 2**30:.2f} GiB at {level.arena.path}" for level in manager.levels))
    return manager


def _model_path(model: str | None) -> str:
    if model:
        return model
    from shared.model.default_model import resolve_model  # the packaged model's converted folder
    return str(resolve_model(None))


class TierHooks:
    """What EngineCore calls: the tier manager (None when off) and the step timer feeding its
    cost model with seconds per prompt token computed (steps with two batches in flight are
    not timed: their spans overlap)."""

    def __init__(self, manager: KVTierManager | None):
        self.manager = manager
        self._started: tuple[SchedulerOutput, float, int] | None = None

    @classmethod
    def attach(cls, tier_config: KVTierConfig | None, kv_access, kv_manager: KVCacheManager, model: str | None,
               deterministic: bool) -> "TierHooks":
        return cls(attach_tiers(tier_config, kv_access, kv_manager, model, deterministic))

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()

    def scheduled(self, output: SchedulerOutput) -> None:
        if self.manager is None:
            return
        num_prompt = sum(item.num_tokens for item in output.scheduled
                         if item.start_position < len(item.prompt_token_ids))
        self._started = (output, time.perf_counter(), num_prompt) if num_prompt else None

    def applied(self, output: SchedulerOutput) -> None:
        if self._started is not None and self._started[0] is output:
            _, started, num_prompt = self._started
            self.manager.record_compute(num_prompt, time.perf_counter() - started)
        self._started = None
