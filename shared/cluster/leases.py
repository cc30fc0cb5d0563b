"""Block leases of one decode instance: which request holds which KV blocks, until when.

The decode instance (services.decode.leases) grants a lease when it reserves blocks for a
request whose KV is being transferred from a prefill instance, renews it while the prompt
waits for a busy prefill instance, and releases it when Decode takes the reservation, it
is released, or it expired. The engine's scheduler holds the same deadline and times the
reservation out (shared.core.remote_kv), so a lost prefill never leaks blocks; this table
is the service's record of it, purely local and synchronous, and the one writer of the
Redis mirror: with a LeaseMirror, every grant/renew/release is queued for mirroring (best
effort, for `pdserve status`); the serving path never waits on Redis.
"""

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shared.cluster.keys import validate_name
from shared.cluster.lease_mirror import LeaseMirror
from shared.errors import InternalError, InvalidRequestError


@dataclass(frozen=True)
class BlockLeaseRecord:
    """One lease: `request_id` holds `block_ids` on `instance_id` until `expires_at`.

    `expires_at` is on the owning LeaseTable's clock (time.monotonic by default).
    """

    request_id: str
    instance_id: str
    block_ids: tuple[int, ...]
    expires_at: float


def _validate_block_ids(block_ids: Iterable[int]) -> tuple[int, ...]:
    """The engine chose these blocks: anything wrong with them is a bug (InternalError)."""
    ids = tuple(block_ids)
    if not ids:
        raise InternalError("block_ids: must not be empty")
    for block_id in ids:
        if isinstance(block_id, bool) or not isinstance(block_id, int) or block_id < 0:
            raise InternalError(f"block_ids: must be ints >= 0, got {block_id!r}")
    if len(set(ids)) != len(ids):
        raise InternalError(f"block_ids: contains duplicates: {list(ids)}")
    return ids


def _validate_ttl_s(ttl_s: float) -> None:
    is_number = isinstance(ttl_s, (int, float)) and not isinstance(ttl_s, bool)
    if not is_number or not math.isfinite(ttl_s) or ttl_s <= 0:
        raise InvalidRequestError("ttl_s", f"must be a finite number > 0, got {ttl_s!r}")


class LeaseTable:
    """In-process lease table of one instance."""

    def __init__(
        self,
        instance_id: str,
        clock: Callable[[], float] = time.monotonic,
        mirror: LeaseMirror | None = None,
    ):
        self.instance_id = validate_name("instance_id", instance_id)
        self.clock = clock
        self.mirror = mirror
        self._leases: dict[str, BlockLeaseRecord] = {}
        self._owner_by_block_id: dict[int, str] = {}

    def grant(self, request_id: str, block_ids: Iterable[int], ttl_s: float) -> BlockLeaseRecord:
        """Lease blocks to a request for ttl_s seconds from now."""
        if not isinstance(request_id, str) or not request_id:
            raise InvalidRequestError("request_id", "must be a non-empty string")
        if request_id in self._leases:
            raise InvalidRequestError("request_id", f"{request_id!r} already holds a lease")
        ids = _validate_block_ids(block_ids)
        _validate_ttl_s(ttl_s)
        taken = {b: self._owner_by_block_id[b] for b in ids if b in self._owner_by_block_id}
        if taken:
            raise InternalError(f"block_ids: already leased (block -> request): {taken}")
        record = BlockLeaseRecord(request_id, self.instance_id, ids, self.clock() + ttl_s)
        self._leases[request_id] = record
        self._owner_by_block_id.update(dict.fromkeys(ids, request_id))
        if self.mirror is not None:
            self.mirror.publish(record, ttl_s)
        return record

    def release(self, request_id: str) -> BlockLeaseRecord | None:
        """End a request's lease; return it, or None if the request held none."""
        record = self._leases.pop(request_id, None)
        if record is None:
            return None
        for block_id in record.block_ids:
            del self._owner_by_block_id[block_id]
        if self.mirror is not None:
            self.mirror.retract(record)
        return record

    def renew(self, request_id: str, ttl_s: float) -> BlockLeaseRecord | None:
        """Move a lease's expiry to ttl_s seconds from now; None if the request holds none."""
        _validate_ttl_s(ttl_s)
        record = self._leases.get(request_id)
        if record is None:
            return None
        record = dataclasses.replace(record, expires_at=self.clock() + ttl_s)
        self._leases[request_id] = record
        if self.mirror is not None:
            self.mirror.publish(record, ttl_s)
        return record

    def republish(self) -> int:
        """Queue every current lease to the mirror again with its remaining TTL (after Redis
        lost them: a restart); returns how many."""
        if self.mirror is None:
            return 0
        now = self.clock()
        live = [record for record in self._leases.values() if record.expires_at > now]
        for record in live:
            self.mirror.publish(record, record.expires_at - now)
        return len(live)

    def get(self, request_id: str) -> BlockLeaseRecord | None:
        return self._leases.get(request_id)

    def __len__(self) -> int:
        return len(self._leases)
