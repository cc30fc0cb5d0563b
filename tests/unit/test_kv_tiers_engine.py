"""The KV tiers under an engine's pool, on the tiny fp32 model: a prefix evicted from the pool
comes back from the host tier (or the file tier below it), bit for bit, so greedy output is
the same as computing it; a corrupt block or a costlier load is computed again instead; every
block returns to the pool."""

import dataclasses
import fcntl
import os

import pytest

from shared.engine import LLM, SamplingParams
from shared.kv_cache.block_hash import prompt_block_hashes
from shared.kv_tier.config import KVTierConfig

NUM_BLOCKS = 12
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
PROMPT_A = [(7 * i) % 200 + 3 for i in range(70)]  # 4 full blocks of 16, then 6 tokens
FILLERS = [[(11 * i + k) % 200 + 3 for i in range(60)] for k in range(1, 4)]


# The tiny model computes a block in microseconds, about what loading one costs: seeded as
# nearly free, loads always win the first choice (the only one each test makes) whatever the
# engine measures its compute at on a busy machine.
NEARLY_FREE_S = 1e-9


def tiered_llm(folder, tmp_path, **tier):
    config = KVTierConfig(**{"host_bytes": 64 << 20, "host_dir": str(tmp_path), "host_load_seconds_per_block":
                             NEARLY_FREE_S, "file_load_seconds_per_block": NEARLY_FREE_S, **tier})
    return LLM(model=str(folder), dtype="float32", num_blocks=NUM_BLOCKS, kv_tier=config)


def tier_stats(llm, name="host"):
    return next(s for s in llm.engine.core.tiers.manager.stats() if s.tier == name)


def evict_prompt_a(llm) -> None:
    for filler in FILLERS:  # 3 x 4 blocks: the pool reuses every block of A
        llm.generate([filler], GREEDY)
    assert llm.engine.core.block_pool.lookup(hashes_of_a(llm)[0], tuple(PROMPT_A[:16])) is None


def hashes_of_a(llm) -> list[bytes]:
    return prompt_block_hashes(PROMPT_A, llm.engine.core.kv_manager.hash_recipe)


def assert_pool_is_whole(llm) -> None:
    pool = llm.engine.core.block_pool
    assert pool.num_free_blocks == pool.num_blocks


@pytest.fixture(scope="module")
def reference(tiny_llama_folder):
    """Prompt A's greedy tokens computed without any cache."""
    llm = LLM(model=str(tiny_llama_folder), dtype="float32", num_blocks=NUM_BLOCKS, enable_prefix_caching=False)
    return llm.generate([PROMPT_A], GREEDY)[0].outputs[0].token_ids


def test_an_evicted_prefix_is_loaded_back_and_gives_the_same_tokens(tiny_llama_folder, tmp_path, reference):
    llm = tiered_llm(tiny_llama_folder, tmp_path)
    first = llm.generate([PROMPT_A], GREEDY)[0]
    evict_prompt_a(llm)
    again = llm.generate([PROMPT_A], GREEDY)[0]
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == reference
    assert again.num_cached_tokens == 64  # 4 blocks from the host tier
    stats = tier_stats(llm)
    assert stats.num_loads == 4 and stats.recompute_avoided_tokens == 64 and stats.num_load_decisions >= 1
    assert stats.num_stores > 0 and stats.num_blocks == stats.num_stores
    assert_pool_is_whole(llm)


def test_another_engine_on_the_host_finds_what_the_first_one_stored(tiny_llama_folder, tmp_path, reference):
    writer = tiered_llm(tiny_llama_folder, tmp_path)
    writer.generate([PROMPT_A], GREEDY)  # write-through: stored when its blocks are freed
    writer.shutdown()
    reader = tiered_llm(tiny_llama_folder, tmp_path)
    output = reader.generate([PROMPT_A], GREEDY)[0]
    assert output.num_cached_tokens == 64 and output.outputs[0].token_ids == reference
    assert_pool_is_whole(reader)


def test_the_file_tier_takes_what_the_host_tier_pushes_out(tiny_llama_folder, tmp_path, reference):
    block_bytes = 2 * 2 * 16 * 2 * 16 * 4  # the tiny model: 2 layers, 2 KV heads, head dim 16, fp32
    llm = tiered_llm(tiny_llama_folder, tmp_path, host_bytes=6 * block_bytes, file_bytes=64 << 20,
                     file_dir=str(tmp_path / "file"))
    assert llm.engine.core.executor.kv_cache_layout.bytes_per_block == block_bytes
    llm.generate([PROMPT_A], GREEDY)
    evict_prompt_a(llm)  # 16 blocks stored through a 6-block host tier: A moved down
    again = llm.generate([PROMPT_A], GREEDY)[0]
    assert again.outputs[0].token_ids == reference and again.num_cached_tokens == 64
    assert tier_stats(llm, "file").num_loads > 0
    assert_pool_is_whole(llm)


def test_a_corrupt_block_is_computed_again(tiny_llama_folder, tmp_path, reference):
    llm = tiered_llm(tiny_llama_folder, tmp_path)
    llm.generate([PROMPT_A], GREEDY)
    evict_prompt_a(llm)
    arena = llm.engine.core.tiers.manager.levels[0].arena
    arena._data[arena._find(hashes_of_a(llm)[1])[1]][5] ^= 0x40
    again = llm.generate([PROMPT_A], GREEDY)[0]
    assert again.outputs[0].token_ids == reference
    assert again.num_cached_tokens == 16  # block 0 loaded, block 1 failed its CRC-32: computed from there
    assert tier_stats(llm).num_corrupt == 1
    assert_pool_is_whole(llm)


def test_a_tier_whose_lock_another_process_holds_is_passed_over(tiny_llama_folder, tmp_path, reference):
    """As when a process of the host is stopped while it holds the host tier's lock: lookups,
    loads and stores give up after the patience (counted), and the prompt is computed."""
    llm = tiered_llm(tiny_llama_folder, tmp_path)
    llm.generate([PROMPT_A], GREEDY)
    evict_prompt_a(llm)
    arena = llm.engine.core.tiers.manager.levels[0].arena
    arena._lock.patience_s = 0.01
    held_elsewhere = os.open(arena.path, os.O_RDWR)  # its own flock, as another process's
    fcntl.flock(held_elsewhere, fcntl.LOCK_EX)
    try:
        again = llm.generate([PROMPT_A], GREEDY)[0]
    finally:
        os.close(held_elsewhere)
    assert again.outputs[0].token_ids == reference and again.num_cached_tokens == 0
    assert tier_stats(llm).num_busy_skips >= 2  # the lookup, the store when its blocks were freed
    assert_pool_is_whole(llm)
    evict_prompt_a(llm)
    assert llm.generate([PROMPT_A], GREEDY)[0].num_cached_tokens == 64  # the lock free again: loaded


def test_a_load_measured_costlier_than_computing_is_not_done(tiny_llama_folder, tmp_path, reference):
    llm = tiered_llm(tiny_llama_folder, tmp_path, host_load_seconds_per_block=10.0)
    llm.generate([PROMPT_A], GREEDY)
    evict_prompt_a(llm)
    again = llm.generate([PROMPT_A], GREEDY)[0]
    assert again.outputs[0].token_ids == reference and again.num_cached_tokens == 0
    stats = tier_stats(llm)
    assert stats.num_recompute_decisions >= 1 and stats.num_loads == 0
    assert_pool_is_whole(llm)


def test_without_write_through_only_evicted_blocks_are_stored(tiny_llama_folder, tmp_path):
    llm = tiered_llm(tiny_llama_folder, tmp_path, write_through=False)
    llm.generate([PROMPT_A], GREEDY)
    assert tier_stats(llm).num_stores == 0
    evict_prompt_a(llm)
    assert tier_stats(llm).num_stores >= 4
    assert llm.generate([PROMPT_A], GREEDY)[0].num_cached_tokens == 64
    assert_pool_is_whole(llm)


def test_the_config_crosses_the_process_boundary():
    import msgspec
    config = KVTierConfig(host_bytes=1 << 20, file_bytes=2 << 20, file_dir="/x", host_load_seconds_per_block=0.5)
    encoded = msgspec.msgpack.encode(config)
    assert msgspec.msgpack.decode(encoded, type=KVTierConfig) == config
    assert dataclasses.replace(config, host_bytes=0, file_bytes=0).is_enabled is False


def test_a_tier_that_cannot_be_made_is_refused_naming_the_setting(tiny_llama_folder, tmp_path):
    from shared.errors import ConfigurationError
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    with pytest.raises(ConfigurationError, match="kv_host_tier_gb"):
        tiered_llm(tiny_llama_folder, tmp_path, host_dir=str(blocker / "tier"))


def test_kv_events_name_the_tier_each_block_enters_and_leaves(tiny_llama_folder, tmp_path):
    """With KV events on (shared.kv_events), the host tier's stores and removals come with medium
    CPU and the file tier's with DISK, each stored block with its tokens; blocks loaded back
    into the pool are stored there again (GPU) as a chain."""
    from shared.kv_events.log import KVEventLog
    from shared.kv_events.wire import TYPES, external_hash
    block_bytes = 2 * 2 * 16 * 2 * 16 * 4
    llm = tiered_llm(tiny_llama_folder, tmp_path, host_bytes=6 * block_bytes, file_bytes=64 << 20,
                     file_dir=str(tmp_path / "file"))
    log = llm.engine.core.block_pool.kv_event_log = KVEventLog(TYPES["array"])
    llm.generate([PROMPT_A], GREEDY)
    evict_prompt_a(llm)
    events = log.drain()
    stored = {(event.medium, event.block_hashes[0]): event.token_ids for event in events
              if isinstance(event, TYPES["array"].block_stored) and event.medium != "GPU"}
    removed = {(event.medium, h) for event in events if isinstance(event, TYPES["array"].block_removed)
               for h in event.block_hashes}
    for index, digest in enumerate(hashes_of_a(llm)):
        assert stored[("CPU", external_hash(digest))] == PROMPT_A[16 * index:16 * (index + 1)]
        assert ("DISK", external_hash(digest)) in stored and ("CPU", external_hash(digest)) in removed
    llm.generate([PROMPT_A], GREEDY)  # its 4 full blocks come back from the tiers
    loaded = [event for event in log.drain() if isinstance(event, TYPES["array"].block_stored)
              and event.medium == "GPU" and event.parent_block_hash is None]
    assert loaded[0].block_hashes == [external_hash(digest) for digest in hashes_of_a(llm)]
    assert loaded[0].token_ids == PROMPT_A[:64]


def test_tier_events_a_busy_lock_holds_back_come_as_a_snapshot_next_time(tiny_llama_folder, tmp_path):
    from shared.engine.introspection import kv_cache_events
    llm = tiered_llm(tiny_llama_folder, tmp_path)
    core = llm.engine.core
    kv_cache_events(core.block_pool, tiers=core.tiers.manager)  # start from no pending events
    llm.generate([PROMPT_A], GREEDY)  # stores A's blocks (write-through)
    arena = core.tiers.manager.levels[0].arena
    arena._lock.patience_s = 0.01
    held_elsewhere = os.open(arena.path, os.O_RDWR)
    fcntl.flock(held_elsewhere, fcntl.LOCK_EX)
    try:
        held_back = kv_cache_events(core.block_pool, snapshot=True, tiers=core.tiers.manager)
    finally:
        os.close(held_elsewhere)
    assert held_back.tier_stored == () and not held_back.is_tier_snapshot
    following = kv_cache_events(core.block_pool, tiers=core.tiers.manager)
    assert following.is_tier_snapshot and set(hashes_of_a(llm)) <= set(following.tier_stored)
