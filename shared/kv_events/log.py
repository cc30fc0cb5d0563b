"""The events an engine made since its last step ended, as vLLM's messages (shared.kv_events.wire).

The pool, the KV cache manager and the KV tiers record into it on the engine's thread; the
engine hands what it holds to the publisher once per step. Nothing here waits: past
`max_pending` events (nobody drains) further ones are dropped and counted.
"""

from collections.abc import Sequence

from shared.kv_events.wire import WireTypes, external_hash

DEFAULT_MAX_PENDING = 100_000


class KVEventLog:
    def __init__(self, types: WireTypes, max_pending: int = DEFAULT_MAX_PENDING):
        self.types = types
        self.max_pending = max_pending
        self.num_dropped = 0
        self._events: list = []

    def stored(self, digests: Sequence[bytes], parent: bytes | None, token_ids: Sequence[int], block_size: int,
               medium: str, lora_id: int | None = None, lora_name: str | None = None,
               extra_keys: list[tuple[str, ...] | None] | None = None) -> None:
        """Blocks (a chain: each the next one's parent) entered `medium`'s cache."""
        more = {"extra_keys": extra_keys, "group_idx": 0} if self.types.has_extra_fields else {}
        self._append(self.types.block_stored(
            [external_hash(digest) for digest in digests], external_hash(parent) if parent else None,
            list(token_ids), block_size, lora_id, medium, lora_name, **more))

    def removed(self, digests: Sequence[bytes], medium: str) -> None:
        """Blocks left `medium`; joins the previous event when that removed from it too."""
        hashes = [external_hash(digest) for digest in digests]
        last = self._events[-1] if self._events else None
        if isinstance(last, self.types.block_removed) and last.medium == medium:
            last.block_hashes.extend(hashes)
            return
        more = {"group_idx": 0} if self.types.has_extra_fields else {}
        self._append(self.types.block_removed(hashes, medium, **more))

    def cleared(self) -> None:
        self._append(self.types.all_blocks_cleared())

    def drain(self) -> list:
        events, self._events = self._events, []
        return events

    def _append(self, event) -> None:
        if len(self._events) >= self.max_pending:
            self.num_dropped += 1
            return
        self._events.append(event)
