"""Builds the engine's `Speculator` from its `SpeculativeConfig` (called by
`shared.engine.loading.build_engine_parts` at start-up)."""

import logging
from dataclasses import replace
from pathlib import Path

from shared.errors import ConfigurationError
from shared.kv_cache.layout import KVCacheLayout
from shared.model.config import ModelConfig
from shared.spec_decode.config import SpeculativeConfig
from shared.spec_decode.draft_proposer import DraftModelProposer
from shared.spec_decode.proposer import NgramProposer
from shared.spec_decode.speculator import Speculator

logger = logging.getLogger(__name__)


def draft_model_config(spec: SpeculativeConfig, target_folder: Path) -> ModelConfig | None:
    """The draft's hyper-parameters (after truncation), or None without a draft model."""
    if spec.speculative_method != "draft":
        return None
    config = ModelConfig.from_folder(_draft_folder(spec, target_folder))
    if spec.draft_num_layers is not None:
        if spec.draft_num_layers > config.num_layers:
            raise ConfigurationError("draft_num_layers", f"must be in [1, {config.num_layers}], "
                                                          f"got {spec.draft_num_layers}")
        config = replace(config, num_layers=spec.draft_num_layers)
    return config


def build_speculator(spec: SpeculativeConfig, target_folder: Path, target: ModelConfig,
                     target_layout: KVCacheLayout, max_model_len: int) -> Speculator | None:
    if spec.speculative_method == "none":
        return None
    if spec.speculative_method == "ngram":
        return Speculator(NgramProposer(spec.ngram_min, spec.ngram_max))
    from shared.model.loader import load_model
    model, config = load_model(_draft_folder(spec, target_folder), target_layout.dtype, spec.draft_num_layers)
    _check_compatible(config, target, max_model_len)
    layout = KVCacheLayout(config.num_layers, target_layout.num_blocks, target_layout.block_size,
                           config.num_kv_heads, config.head_dim, target_layout.dtype)
    logger.info("draft model: %d layers, %.1f MiB of draft KV", config.num_layers,
                layout.num_blocks * layout.bytes_per_block / 2**20)
    return Speculator(DraftModelProposer(model, layout))


def _draft_folder(spec: SpeculativeConfig, target_folder: Path) -> Path:
    if not spec.draft_model:
        return target_folder
    from shared.model.default_model import resolve_model
    return resolve_model(spec.draft_model)


def _check_compatible(draft: ModelConfig, target: ModelConfig, max_model_len: int) -> None:
    if draft.vocab_size != target.vocab_size:
        raise ConfigurationError("draft_model", f"vocabulary of {draft.vocab_size} tokens differs from "
                                                 f"the target's {target.vocab_size}")
    if draft.max_position_embeddings < max_model_len:
        raise ConfigurationError("draft_model", f"handles {draft.max_position_embeddings} positions, "
                                                 f"fewer than max_model_len {max_model_len}")
