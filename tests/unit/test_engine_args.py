"""EngineArgs: the one model of an engine's settings. LLM(...) keywords, an instance's flags,
variables and settings file, `pdserve offline`/`profile` and the benchmarks all build it, and
`create_engine_config()` turns it into the engine's config objects."""

import dataclasses

import pytest

from services.cli.main import build_parser
from services.settings.engine_flags import engine_args_from
from services.instance.engine_setup import engine_config
from services.instance.settings import InstanceSettings
from shared.config import CacheConfig, EngineConfig
from shared.core.scheduler_config import SchedulerConfig
from shared.engine_args import GIB, EngineArgs
from shared.errors import ConfigurationError
from shared.guided.limits import GuidedLimits
from shared.kv_tier.config import KVTierConfig
from shared.lora.config import LoRAConfig
from shared.model.dtypes import DTYPES
from shared.parallel.config import ParallelConfig
from shared.spec_decode.config import SpeculativeConfig


def test_the_defaults_build_the_config_sections_defaults():
    """EngineArgs() and the sections' own defaults agree, so LLM() builds the engine it always did."""
    assert EngineArgs().create_engine_config() == EngineConfig(
        cache=CacheConfig(), scheduler=SchedulerConfig(), speculative=SpeculativeConfig(), guided=GuidedLimits(),
        parallel=ParallelConfig(), lora=LoRAConfig())


def test_every_field_reaches_its_config_section():
    tiers = KVTierConfig(host_bytes=1 << 20)
    args = EngineArgs(model="/m", dtype="float32", device="cpu", attention_backend="torch", num_threads=3,
                      kv_cache_memory_gb=0.5, num_blocks=40, block_size=8, prefix_hash_algo="blake2b",
                      max_model_len=512, max_num_seqs=7, max_num_batched_tokens=99, max_prefill_chunk_tokens=32,
                      max_num_partial_prefills=3,
                      seed=5, deterministic=True, max_grammar_bytes=100, max_grammar_nesting_depth=6,
                      grammar_compile_timeout_s=2.0, grammar_cache_size=9, enable_lora=True, max_loras=2,
                      max_lora_rank=8, max_cpu_loras=5, speculative_method="draft", num_speculative_tokens=4,
                      draft_num_layers=2, tensor_parallel_size=2, pipeline_parallel_size=3,
                      enable_prefix_caching=False, fair_prefill=False, ngram_max=5, num_compile_threads=1,
                      worker_step_timeout_s=9.0, kv_tier=tiers)
    config = args.create_engine_config()
    assert (config.model, config.dtype, config.device, config.attention_backend, config.num_threads,
            config.max_model_len, config.seed, config.deterministic, config.kv_tier) == (
        "/m", "float32", "cpu", "torch", 3, 512, 5, True, tiers)
    assert config.cache == CacheConfig(block_size=8, kv_cache_memory_bytes=GIB // 2, num_blocks=40,
                                       enable_prefix_caching=False, prefix_hash_algo="blake2b")
    assert config.scheduler == SchedulerConfig(max_num_seqs=7, max_num_batched_tokens=99,
                                               long_prefill_token_threshold=32, fair_prefill=False,
                                               max_num_partial_prefills=3)
    assert config.guided == GuidedLimits(100, 6, 2.0, 9, 1)
    assert config.lora == LoRAConfig(True, 2, 8, 5)
    assert config.speculative == SpeculativeConfig("draft", 4, None, 2, ngram_max=5)
    assert config.parallel == ParallelConfig(2, 3, 9.0)


def test_zero_none_and_empty_mean_not_set():
    for unset in (0, None):
        config = EngineArgs(num_blocks=unset, max_model_len=unset, num_threads=unset).create_engine_config()
        assert (config.cache.num_blocks, config.max_model_len, config.num_threads) == (None, None, None)
    assert EngineArgs(model=None).create_engine_config().model is None
    assert EngineArgs(max_prefill_chunk_tokens=-1).create_engine_config().scheduler.long_prefill_token_threshold == 0


def test_an_unknown_keyword_is_refused_naming_it():
    with pytest.raises(ConfigurationError, match="^kv_cache_gb: is not an engine setting"):
        EngineArgs.from_kwargs(kv_cache_gb=2)
    with pytest.raises(ConfigurationError, match="^cache: is not an engine setting"):
        EngineArgs.from_kwargs(cache=CacheConfig())


def test_bad_values_name_the_field():
    with pytest.raises(ConfigurationError, match="^block_size: Input should be greater than 0, got 0"):
        EngineArgs.from_kwargs(block_size=0)
    with pytest.raises(ConfigurationError, match="^dtype: "):
        EngineArgs.from_kwargs(dtype="int8")
    with pytest.raises(ConfigurationError, match="^max_cpu_loras: must be an int >= max_loras"):
        EngineArgs.from_kwargs(max_loras=4, max_cpu_loras=2)
    with pytest.raises(ConfigurationError, match="^draft_num_layers"):
        EngineArgs.from_kwargs(speculative_method="draft")


def test_the_config_sections_names_are_accepted_as_aliases():
    args = EngineArgs.from_kwargs(kv_cache_memory_bytes=3 << 28, long_prefill_token_threshold=16, max_bytes=10,
                                  max_nesting_depth=3, compile_timeout_s=1.5, max_cached_grammars=4)
    config = args.create_engine_config()
    assert config.cache.kv_cache_memory_bytes == 3 << 28
    assert config.scheduler.long_prefill_token_threshold == 16
    assert config.guided == GuidedLimits(10, 3, 1.5, 4)


def test_the_dtype_names_are_the_loaders():
    assert all(EngineArgs(dtype=name).create_engine_config().dtype == name for name in DTYPES)
    with pytest.raises(ConfigurationError, match="dtype"):
        EngineArgs.from_kwargs(dtype="float16")


def test_instance_settings_hold_the_engine_args():
    settings = InstanceSettings(role="colocated", block_size=8, num_blocks=20, dtype="float32", lease_ms=500)
    assert settings.engine == EngineArgs(block_size=8, num_blocks=20, dtype="float32")
    assert InstanceSettings(role="colocated", engine=EngineArgs(block_size=8, num_blocks=20, dtype="float32"),
                            lease_ms=500) == settings
    assert InstanceSettings(engine=EngineArgs(block_size=8), num_blocks=3).engine == EngineArgs(block_size=8,
                                                                                                  num_blocks=3)
    with pytest.raises(ConfigurationError, match="^num_blocks: Input should be greater than or equal to 0"):
        InstanceSettings(num_blocks=-1)


def test_an_instance_builds_its_config_from_its_engine_args_and_role():
    settings = InstanceSettings(role="prefill", kv_host_tier_gb=0, block_size=8, speculative_method="ngram",
                                lora_modules=("a=/x",))
    config = engine_config(settings)
    expected = dataclasses.replace(settings.engine, speculative_method="none", enable_lora=True,
                                   max_prefill_chunk_tokens=0, kv_transfer=config.kv_transfer).create_engine_config()
    assert config == expected and config.kv_transfer is not None
    decode = engine_config(InstanceSettings(role="decode", kv_host_tier_gb=0))
    assert decode.scheduler.long_prefill_token_threshold == 64


def test_offline_flags_are_the_engine_args_fields():
    args = build_parser().parse_args(["offline", "hi", "--dtype", "float32", "--tensor-parallel-size", "2",
                                      "--speculative-method", "ngram", "--seed", "7"])
    engine_args = engine_args_from(args)
    assert engine_args == EngineArgs(dtype="float32", tensor_parallel_size=2, speculative_method="ngram")
    assert args.seed == 7  # the sampling seed, not the engine's
