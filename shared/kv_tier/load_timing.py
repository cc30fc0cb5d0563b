"""Time what loading KV blocks from a tier costs, the way an engine loads them: blocks of the
engine's own cache stored in a tier arena, then copied back into pool blocks with their CRC-32
checked, timed per run of k blocks (`pdserve profile`)."""

import hashlib
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from shared.kv_cache.layout import KVCacheLayout
from shared.kv_tier.arena import ArenaGeometry, KVArena
from shared.kv_tier.block_copy import copy_block_to_slot, copy_slot_to_block


def time_arena_loads(directory: Path, kv_cache: torch.Tensor, layout: KVCacheLayout, run_lengths: Sequence[int],
                     repeats: int) -> list[tuple[int, list[float]]]:
    """Per run length that fits the cache, `repeats` timings (seconds) of loading that many
    blocks from an arena in `directory` (the caller's, which it removes after)."""
    num_blocks = min(max(run_lengths), layout.num_blocks)
    fingerprint = hashlib.sha256(f"profile-{directory}".encode()).digest()
    arena = KVArena(directory / "profile.arena", fingerprint,
                    ArenaGeometry(layout.bytes_per_block, num_blocks, layout.block_size))
    try:
        hashes = [hashlib.sha256(str(i).encode()).digest() for i in range(num_blocks)]
        tokens = [tuple(range(layout.block_size))] * num_blocks
        arena.put(hashes, tokens, lambda index, slot: copy_block_to_slot(kv_cache, layout, index, slot))
        timings = []
        for length in (n for n in run_lengths if n <= num_blocks):
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                num_loaded, _ = arena.load_run(hashes[:length], tokens[:length],
                                               lambda index, slot: copy_slot_to_block(slot, kv_cache, layout, index))
                seconds.append(time.perf_counter() - started)
                if num_loaded != length:
                    raise RuntimeError(f"loaded {num_loaded} of {length} blocks from the {directory} arena")
            timings.append((length, seconds))
        return timings
    finally:
        arena.close()
