"""Memory introspection and its metrics: glibc stats, heap trimming, bytes by component,
the staging pool's bound, and the gauges an instance exports."""

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from shared.engine import LLM
from shared.memory.cache_usage import CacheUsage
from shared.memory.components import COMPONENTS, memory_by_component
from shared.memory.engine_memory import kv_pool_bytes, weight_bytes
from shared.memory.idle_trim import HeapTrimmer, TrimPolicy
from shared.memory.malloc_stats import is_glibc, malloc_stats
from shared.memory.process import resident_bytes
from shared.metrics.memory_collector import MemoryCollector
from shared.model.row_buckets import bucketed_rows


@pytest.mark.skipif(not is_glibc(), reason="glibc only")
def test_malloc_stats_see_a_large_allocation():
    """The counts are the whole process's: other threads of the test process (services left
    running by earlier tests) may free a little between the two reads (a CI run saw 624 bytes
    less than the 8 MiB held), so the check leaves them half of a larger allocation."""
    before = malloc_stats()
    held = bytearray(64 << 20)
    after = malloc_stats()
    assert after.in_use_bytes - before.in_use_bytes >= 32 << 20
    assert after.num_arenas >= 1
    del held


@pytest.mark.skipif(not is_glibc(), reason="glibc only")
def test_heap_trimmer_reads_and_trims_the_real_heap_once_per_idle_period():
    trimmer = HeapTrimmer(TrimPolicy(min_free_bytes=0, idle_interval_s=3600))
    trimmer.on_loop(is_idle=False)
    assert trimmer.on_loop(is_idle=True) is True
    assert trimmer.on_loop(is_idle=True) is False
    assert trimmer.num_idle_trims == 1 and trimmer.trim_seconds > 0


def test_components_add_up_to_the_resident_set():
    parts = memory_by_component(weights=1000, kv_pool=2000, staging=0, caches=0)
    assert tuple(parts) == COMPONENTS
    assert parts["other"] >= 0
    assert sum(parts.values()) >= resident_bytes() - (64 << 20)  # RSS moves a little between reads


def test_engine_weights_and_kv_pool_are_measured(tiny_llama_folder):
    llm = LLM(model=str(tiny_llama_folder), dtype="float32", num_blocks=8)
    executor = llm.engine.core.executor
    assert kv_pool_bytes(executor) == executor.kv_cache.numel() * executor.kv_cache.element_size()
    num_parameters = sum(p.numel() for p in executor.runner.model.parameters())
    assert weight_bytes(executor) >= 4 * num_parameters > 0


def test_memory_gauges_are_exported_by_component_and_cache():
    registry = CollectorRegistry()
    caches = [CacheUsage("kv_staging", 2, -1, 3 << 20, 128 << 20), CacheUsage("onednn_primitives", -1, 128, -1)]
    registry.register(MemoryCollector({"role": "prefill"}, lambda: {"kv_pool": 5, "other": 7}, lambda: caches))
    text = generate_latest(registry).decode()
    assert 'pdserve:memory_bytes{component="kv_pool",role="prefill"} 5.0' in text
    assert 'pdserve:cache_max_bytes{cache="kv_staging",role="prefill"} 1.34217728e+08' in text
    assert 'pdserve:cache_max_entries{cache="onednn_primitives",role="prefill"} 128.0' in text
    assert 'cache_entries{cache="onednn_primitives"' not in text  # unknown: not exported


@pytest.mark.parametrize("num_rows, bucket", [(1, 8), (8, 8), (9, 16), (128, 128), (129, 192), (2048, 2048),
                                              (2049, 2304)])
def test_row_counts_round_up_to_few_buckets(num_rows, bucket):
    assert bucketed_rows(num_rows) == bucket


def test_distinct_row_buckets_stay_few():
    assert len({bucketed_rows(rows) for rows in range(1, 2049)}) == 16 + 30


def test_the_grammar_cache_reports_its_entries_limit_and_bytes(tiny_llama_folder):
    from shared.engine import SamplingParams
    from shared.guided import GuidedDecodingParams
    from shared.memory.engine_memory import grammar_cache_usage
    from tests.unit.guided_vocab import tiny_grammar_cache

    llm = LLM(model=str(tiny_llama_folder), dtype="float32", num_blocks=16)
    assert grammar_cache_usage(llm.engine.core) is None
    llm.engine.core.guided.use_grammar_cache(tiny_grammar_cache(max_entries=3))
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, guided=GuidedDecodingParams(choice=["yes", "no"])))
    usage = grammar_cache_usage(llm.engine.core)
    assert (usage.name, usage.num_entries, usage.max_entries) == ("compiled_grammars", 1, 3)
    assert usage.memory_bytes > 0
