"""The KV arena: a bounded, process-shared store of blocks keyed by block hash (shared.kv_tier.arena).

Blocks here are 64-byte slots whose bytes are a pattern derived from their hash, so any torn
or misplaced copy shows."""

import fcntl
import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from shared.kv_tier import patient_lock
from shared.kv_tier.arena import ArenaFormatError, ArenaGeometry, KVArena, WRITING
from shared.kv_tier.patient_lock import ArenaBusy

SLOT_BYTES = 64
BLOCK_SIZE = 4
FINGERPRINT = hashlib.sha256(b"settings").digest()


def block_hash(n: int) -> bytes:
    return hashlib.sha256(str(n).encode()).digest()


def colliding_hash(n: int) -> bytes:
    """Hashes whose first 8 bytes agree: one probe run in the index."""
    return b"\x07" * 8 + hashlib.sha256(str(n).encode()).digest()[8:]


def tokens_of(h: bytes) -> tuple[int, ...]:
    return tuple(h[:BLOCK_SIZE])


def pattern(h: bytes) -> np.ndarray:
    return np.frombuffer(hashlib.sha512(h).digest(), np.uint8)[:SLOT_BYTES]


def put(arena: KVArena, hashes: list[bytes], on_evict=None):
    def copy_in(index, slot):
        slot[:] = pattern(hashes[index])
    return arena.put(hashes, [tokens_of(h) for h in hashes], copy_in, on_evict=on_evict)


def load(arena: KVArena, hashes: list[bytes]) -> tuple[int, int, list[np.ndarray]]:
    copied = []
    num, corrupt = arena.load_run(hashes, [tokens_of(h) for h in hashes],
                                  lambda index, slot: copied.append(slot.copy()))
    return num, corrupt, copied


@pytest.fixture
def arena(tmp_path):
    arena = KVArena(tmp_path / "a.host", FINGERPRINT, ArenaGeometry(SLOT_BYTES, 8, BLOCK_SIZE))
    yield arena
    arena.close()


def test_blocks_come_back_as_stored(arena):
    hashes = [block_hash(i) for i in range(5)]
    result = put(arena, hashes)
    assert result.stored == tuple(hashes) and result.evicted == ()
    num, corrupt, copied = load(arena, hashes)
    assert (num, corrupt) == (5, 0)
    assert all(np.array_equal(data, pattern(h)) for data, h in zip(copied, hashes))
    assert arena.num_valid == 5
    assert put(arena, hashes[:2]).stored == ()  # already there: only marked used


def test_a_run_stops_at_the_first_missing_block_or_other_tokens(arena):
    put(arena, [block_hash(0), block_hash(2)])
    assert arena.count_run([block_hash(0), block_hash(1), block_hash(2)], [tokens_of(block_hash(i)) for i in range(3)]) == 1
    assert arena.count_run([block_hash(0)], [(9, 9, 9, 9)]) == 0  # same hash, other tokens: a miss


def test_the_least_recently_used_blocks_make_room(arena):
    hashes = [block_hash(i) for i in range(8)]
    put(arena, hashes)
    arena.count_run(hashes[:2], [tokens_of(h) for h in hashes[:2]])  # 0 and 1 now most recent
    seen = []
    result = put(arena, [block_hash(100), block_hash(101), block_hash(102)],
                 on_evict=lambda h, tokens, data, crc: seen.append((h, tokens, data.copy())))
    assert result.evicted == tuple(hashes[2:5])
    assert [h for h, _, _ in seen] == hashes[2:5]
    assert all(np.array_equal(data, pattern(h)) and tokens == tokens_of(h) for h, tokens, data in seen)
    assert load(arena, hashes[:2])[0] == 2 and load(arena, hashes[2:3])[0] == 0


def test_the_index_stays_right_through_colliding_inserts_and_deletes(tmp_path):
    arena = KVArena(tmp_path / "c.host", FINGERPRINT, ArenaGeometry(SLOT_BYTES, 6, BLOCK_SIZE))
    rng, model = random.Random(0), []  # model: hashes in LRU order (oldest first)
    for step in range(300):
        h = colliding_hash(rng.randrange(12)) if step % 2 else block_hash(rng.randrange(12))
        if h in model:
            assert load(arena, [h])[0] == 1
            model.remove(h)
        else:
            assert load(arena, [h])[0] == 0
            evicted = put(arena, [h]).evicted
            assert list(evicted) == model[:max(0, len(model) - 5)]
            del model[:len(evicted)]
        model.append(h)
        assert arena.num_valid == len(model)
    assert sorted(arena.hashes()) == sorted(model)
    arena.close()


def test_a_block_that_fails_its_checksum_is_dropped_never_copied(arena):
    hashes = [block_hash(i) for i in range(3)]
    put(arena, hashes)
    arena._data[arena._find(hashes[1])[1]][0] ^= 0xFF  # a bit flip in block 1
    num, corrupt, copied = load(arena, hashes)
    assert (num, corrupt, len(copied)) == (1, 1, 1)
    assert not arena.contains(hashes[1]) and arena.num_valid == 2


def test_content_survives_its_writer_and_a_crash_mid_change(tmp_path):
    path = tmp_path / "s.file"
    writer = KVArena(path, FINGERPRINT, ArenaGeometry(SLOT_BYTES, 8, BLOCK_SIZE))
    hashes = [block_hash(i) for i in range(4)]
    put(writer, hashes)
    # As if the writer died mid-put: the index marked dirty, a slot half-written.
    writer._header["is_dirty"] = 1
    writer._state[writer._find(hashes[3])[1]] = WRITING
    writer._table.fill(-1)
    writer.close()
    reader = KVArena(path, FINGERPRINT, ArenaGeometry(SLOT_BYTES, 2, BLOCK_SIZE))  # adopts 8 slots
    assert reader.geometry.num_slots == 8
    num, _, copied = load(reader, hashes)
    assert num == 3 and all(np.array_equal(d, pattern(h)) for d, h in zip(copied, hashes))
    assert reader.num_valid == 3
    reader.close()


def test_another_fingerprint_is_refused(tmp_path):
    KVArena(tmp_path / "f.host", FINGERPRINT, ArenaGeometry(SLOT_BYTES, 4, BLOCK_SIZE)).close()
    with pytest.raises(ArenaFormatError, match="other cache settings"):
        KVArena(tmp_path / "f.host", hashlib.sha256(b"other").digest(), ArenaGeometry(SLOT_BYTES, 4, BLOCK_SIZE))


_WORKER = textwrap.dedent("""
    import hashlib, random, sys
    import numpy as np
    sys.path.insert(0, {root!r})
    from shared.kv_tier.arena import ArenaGeometry, KVArena
    from tests.unit.test_kv_arena import FINGERPRINT, SLOT_BYTES, BLOCK_SIZE, block_hash, tokens_of, pattern, put
    arena = KVArena({path!r}, FINGERPRINT, ArenaGeometry(SLOT_BYTES, 16, BLOCK_SIZE))
    rng, num_checked = random.Random({seed}), 0
    for _ in range(1500):
        hashes = [block_hash(rng.randrange(40)) for _ in range(rng.randrange(1, 4))]
        if rng.random() < 0.5:
            put(arena, hashes)
        else:
            def check(index, slot):
                assert np.array_equal(slot, pattern(hashes[index])), "torn or misplaced block"
            num, corrupt = arena.load_run(hashes, [tokens_of(h) for h in hashes], check)
            assert corrupt == 0
            num_checked += num
    print(num_checked)
""")


def test_processes_sharing_an_arena_never_see_a_torn_or_misplaced_block(tmp_path):
    path = str(tmp_path / "shared.host")
    workers = [subprocess.Popen([sys.executable, "-c", _WORKER.format(root=str(_repo_root()), path=path, seed=seed)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in range(3)]
    results = [worker.communicate(timeout=120) for worker in workers]
    for worker, (out, err) in zip(workers, results):
        assert worker.returncode == 0, err
        assert int(out) > 0  # each worker read blocks the others wrote
    arena = KVArena(path, FINGERPRINT, ArenaGeometry(SLOT_BYTES, 16, BLOCK_SIZE))
    assert arena.num_valid == len(arena.hashes()) <= 16
    arena.close()


def _repo_root():
    from pathlib import Path
    return Path(__file__).resolve().parents[2]


def test_a_block_stored_by_another_process_during_a_copy_is_kept_once(tmp_path):
    path = tmp_path / "race.host"
    first = KVArena(path, FINGERPRINT, ArenaGeometry(SLOT_BYTES, 4, BLOCK_SIZE))
    second = KVArena(path, FINGERPRINT, ArenaGeometry(SLOT_BYTES, 4, BLOCK_SIZE))  # its own fd: its own flock
    h = block_hash(7)

    def copy_while_the_other_stores(index, slot):
        assert load(second, [h])[0] == 0  # a slot being written is not findable
        assert put(second, [h]).stored == (h,)  # the copy runs outside the lock: the other one is not blocked
        slot[:] = pattern(h)

    result = first.put([h], [tokens_of(h)], copy_while_the_other_stores)
    assert result.stored == () and first.num_valid == 1
    num, corrupt, copied = load(first, [h])
    assert (num, corrupt) == (1, 0) and np.array_equal(copied[0], pattern(h))
    assert len(first.hashes()) == 1
    first.close()
    second.close()


_LOCK_HOLDER = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); " \
               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)"


def test_a_process_stopped_while_holding_the_lock_costs_one_wait_not_a_stall(tmp_path, monkeypatch):
    """A lookup gives up after the patience (ArenaBusy: the manager takes it as a miss); later
    tries do not wait at all while the holder stays stopped; once it is gone, all works."""
    path = tmp_path / "stopped.host"
    arena = KVArena(path, FINGERPRINT, ArenaGeometry(SLOT_BYTES, 8, BLOCK_SIZE), lock_patience_s=0.05)
    hashes = [block_hash(i) for i in range(3)]
    put(arena, hashes)
    holder = subprocess.Popen([sys.executable, "-c", _LOCK_HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGSTOP)
        with pytest.raises(ArenaBusy):
            arena.count_run(hashes, [tokens_of(h) for h in hashes])
        sleeps = []
        monkeypatch.setattr(patient_lock.time, "sleep", sleeps.append)
        for attempt in (lambda: load(arena, hashes), lambda: put(arena, [block_hash(9)]), arena.hashes):
            with pytest.raises(ArenaBusy):
                attempt()
        assert sleeps == []  # one try each, no waiting
        assert arena.num_lock_timeouts == 4
    finally:
        holder.kill()  # a killed process's flock is released
        holder.wait()
    monkeypatch.undo()
    assert load(arena, hashes)[:2] == (3, 0)
    assert put(arena, [block_hash(9)]).stored == (block_hash(9),)
    arena.close()


def test_a_store_whose_publish_finds_the_lock_held_is_published_at_the_next_lock(tmp_path):
    path = tmp_path / "late.host"
    arena = KVArena(path, FINGERPRINT, ArenaGeometry(SLOT_BYTES, 4, BLOCK_SIZE), lock_patience_s=0.01)
    other_fd = os.open(path, os.O_RDWR)  # its own open file: its own flock, as another process's
    h = block_hash(5)

    def copy_while_another_takes_the_lock(index, slot):
        fcntl.flock(other_fd, fcntl.LOCK_EX)
        slot[:] = pattern(h)

    assert arena.put([h], [tokens_of(h)], copy_while_another_takes_the_lock).stored == ()
    fcntl.flock(other_fd, fcntl.LOCK_UN)
    os.close(other_fd)
    num, corrupt, copied = load(arena, [h])  # the slot was kept WRITING, then published here
    assert (num, corrupt) == (1, 0) and np.array_equal(copied[0], pattern(h))
    assert arena.num_valid == 1
    arena.close()
