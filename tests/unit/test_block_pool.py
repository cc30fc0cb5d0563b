"""The block pool: reference counts, LRU free queue, prefix-cache registration and eviction."""

import pytest

from shared.kv_cache.block_hash import hash_block, hash_full_blocks
from shared.kv_cache.block_pool import BlockPool


def test_allocation_takes_the_lowest_free_ids_first():
    pool = BlockPool(4)
    assert [b.block_id for b in pool.allocate(3)] == [0, 1, 2]
    assert pool.num_free_blocks == 1
    assert pool.free_block_ids() == [3]


def test_freed_blocks_join_the_back_of_the_queue_in_the_order_given():
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    pool.free(list(reversed(blocks)))  # a sequence frees its tail first
    assert pool.free_block_ids() == [3, 2, 1, 0]
    assert all(b.ref_count == 0 for b in blocks)


def test_shared_block_is_freed_only_when_the_last_holder_lets_go():
    pool = BlockPool(2)
    [block] = pool.allocate(1)
    pool.touch([block])
    assert block.ref_count == 2
    pool.free([block])
    assert pool.num_free_blocks == 1
    pool.free([block])
    assert pool.num_free_blocks == 2


def test_freeing_an_unheld_block_is_an_error():
    pool = BlockPool(1)
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.free([pool.blocks[0]])


def test_cached_block_survives_free_and_is_revived_by_touch():
    pool = BlockPool(3)
    [block] = pool.allocate(1)
    digest = hash_block(None, [1, 2])
    pool.cache(block, digest, (1, 2))
    pool.free([block])
    assert pool.lookup(digest, (1, 2)) is block
    pool.touch([block])
    assert block.ref_count == 1 and pool.num_free_blocks == 2


def test_allocation_evicts_least_recently_freed_cached_block_first():
    pool = BlockPool(2)
    first, second = pool.allocate(2)
    pool.cache(first, b"a" * 32, (1,))
    pool.cache(second, b"b" * 32, (2,))
    pool.free([second])
    pool.free([first])
    [reused] = pool.allocate(1)
    assert reused is second
    assert pool.lookup(b"b" * 32, (2,)) is None
    assert pool.lookup(b"a" * 32, (1,)) is first
    events = pool.drain_events()
    assert events.stored == [b"a" * 32, b"b" * 32]
    assert events.evicted == [b"b" * 32]
    assert pool.drain_events().stored == []


def test_lookup_compares_token_ids_so_a_hash_collision_is_a_miss():
    pool = BlockPool(1)
    [block] = pool.allocate(1)
    pool.cache(block, b"h" * 32, (5, 6))
    assert pool.lookup(b"h" * 32, (5, 7)) is None


def test_first_writer_of_a_hash_wins():
    pool = BlockPool(2)
    first, second = pool.allocate(2)
    pool.cache(first, b"h" * 32, (1,))
    pool.cache(second, b"h" * 32, (1,))
    assert pool.lookup(b"h" * 32, (1,)) is first
    assert second.block_hash is None


def test_chained_hashes_depend_on_every_earlier_block_and_on_extra_keys():
    tokens = list(range(10))
    hashes = hash_full_blocks(tokens, 4)
    assert len(hashes) == 2  # only full blocks
    assert hashes[1] == hash_block(hashes[0], [4, 5, 6, 7])
    changed_first = hash_full_blocks([99] + tokens[1:], 4)
    assert changed_first[1] != hashes[1]
    salted = hash_full_blocks(tokens, 4, extra_keys=("tenant-a",))
    assert salted[0] != hashes[0]
    assert hash_full_blocks(tokens, 4, algo="blake2b")[0] != hashes[0]
    assert hash_full_blocks(tokens, 4, known_hashes=hashes[:1]) == hashes


def test_events_nobody_drains_are_dropped_past_the_cap_and_a_snapshot_is_asked_for():
    from shared.engine.introspection import kv_cache_events
    pool = BlockPool(4, max_pending_events=3)
    blocks = pool.allocate(4)
    for index, block in enumerate(blocks):
        pool.cache(block, bytes([index]) * 32, (index,))
    assert pool.events_overflowed and pool.drain_events().stored == []
    pool.events_overflowed = True  # as left by the overflow, before the reader came
    snapshot = kv_cache_events(pool)
    assert snapshot.is_snapshot and sorted(snapshot.stored) == sorted(bytes([i]) * 32 for i in range(4))
    assert not pool.events_overflowed
    pool.free(blocks[:1])
    pool.allocate(1)  # evicts block 0's hash
    changes = kv_cache_events(pool)
    assert (changes.is_snapshot, changes.stored, changes.removed) == (False, (), (bytes([0]) * 32,))
