"""vLLM's KV-event messages (vllm/distributed/kv_events.py), field for field, in the two
layouts vLLM has sent:

- "array": every event a tagged array, [tag, field, field, ...] in declaration order (vLLM up to
  0.10, and what llm-d's indexer decodes): BlockStored carries the seven fields every reader
  of this layout knows, BlockRemoved two.
- "map": every event a map with its tag under "type", fields left at their default omitted
  (vLLM 0.11 and later, 0.32 included): BlockStored also carries the per-block extra keys and
  the cache group.

Either way a message's payload is a `KVEventBatch` array [ts, events, data_parallel_rank], and
block hashes go out as vLLM sends them by default: the low 64 bits of the digest, unsigned.
"""

from dataclasses import dataclass

import msgspec

WIRE_FORMATS = ("array", "map")
# The `medium` of each place a block can be: the engine's pool (vLLM calls its pool "GPU" on
# every device), the host tier and the file tier (shared.kv_tier).
MEDIUM_POOL = "GPU"
MEDIUM_BY_TIER = {"host": "CPU", "file": "DISK"}


def external_hash(digest: bytes) -> int:
    """A block digest as vLLM's events carry it: its low 64 bits, big-endian, unsigned."""
    return int.from_bytes(digest[-8:], "big")


@dataclass(frozen=True)
class WireTypes:
    """The message types of one layout."""
    block_stored: type
    block_removed: type
    all_blocks_cleared: type
    batch: type
    # Whether BlockStored takes extra_keys and group_idx.
    has_extra_fields: bool


def _array_types() -> WireTypes:
    class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[int]
        medium: str | None

    class AllBlocksCleared(KVCacheEvent):
        pass

    return WireTypes(BlockStored, BlockRemoved, AllBlocksCleared, _batch(BlockStored | BlockRemoved | AllBlocksCleared),
                     has_extra_fields=False)


def _map_types() -> WireTypes:
    class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple[str, ...] | None] | None = None
        group_idx: int | None = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[int]
        medium: str | None
        group_idx: int | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    return WireTypes(BlockStored, BlockRemoved, AllBlocksCleared, _batch(BlockStored | BlockRemoved | AllBlocksCleared),
                     has_extra_fields=True)


def _batch(event_type) -> type:
    class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[event_type]
        data_parallel_rank: int | None = None

    return KVEventBatch


TYPES = {"array": _array_types(), "map": _map_types()}
