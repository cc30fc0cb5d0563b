"""LeaseMirror: best-effort copy of a LeaseTable's leases into Redis (`ownership` keys).

LeaseTable calls `publish`/`retract` synchronously from the serving path; they only
enqueue. One background worker task (started on first use, in the running loop) applies
the operations in order, each as one Redis command with a timeout; failures are logged
and counted, never raised. Each key carries the lease's TTL, so a crashed instance's
entries vanish by themselves. `list_mirrored_leases` reads them back for `pdserve status`.
"""

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from shared.cluster.keys import ClusterNamespace
from shared.cluster.task_stop import stop_task

if TYPE_CHECKING:
    from shared.cluster.leases import BlockLeaseRecord

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MirroredLease:
    """A lease as seen in Redis by a status reader: `remaining_s` until its key expires."""

    request_id: str
    instance_id: str
    block_ids: tuple[int, ...]
    remaining_s: float


@dataclass(frozen=True)
class _MirrorOp:
    key: str
    payload: str | None  # None means delete the key
    ttl_ms: int = 0


class LeaseMirror:
    """Queues lease writes/deletes and applies them to Redis in order, in the background."""

    def __init__(
        self,
        redis: Redis,
        namespace: ClusterNamespace,
        max_pending: int = 10_000,
        op_timeout_s: float = 2.0,
    ):
        self.redis = redis
        self.namespace = namespace
        self.max_pending = max_pending
        self.op_timeout_s = op_timeout_s
        self.num_failures = 0  # ops dropped (queue full, no loop) or failed in Redis
        self._queue: asyncio.Queue[_MirrorOp] | None = None
        self._worker: asyncio.Task | None = None

    def publish(self, record: "BlockLeaseRecord", ttl_s: float) -> None:
        """Queue writing a granted lease with its TTL (called by LeaseTable.grant)."""
        payload = json.dumps({
            "request_id": record.request_id,
            "instance_id": record.instance_id,
            "block_ids": list(record.block_ids),
        })
        key = self.namespace.ownership(record.instance_id, record.request_id)
        self._enqueue(_MirrorOp(key, payload, max(1, round(ttl_s * 1000))))

    def retract(self, record: "BlockLeaseRecord") -> None:
        """Queue deleting a released lease (called by LeaseTable.release)."""
        key = self.namespace.ownership(record.instance_id, record.request_id)
        self._enqueue(_MirrorOp(key, None))

    async def flush(self) -> None:
        """Wait until every queued operation has been applied or has failed."""
        if self._queue is not None:
            self._ensure_worker()
            await self._queue.join()

    async def close(self) -> None:
        """Stop the worker; operations still queued are dropped."""
        if self._worker is not None:
            await stop_task(self._worker, "the lease mirror's worker")
            self._worker = None

    def _enqueue(self, op: _MirrorOp) -> None:
        try:
            self._ensure_worker()
            self._queue.put_nowait(op)
        except (RuntimeError, asyncio.QueueFull) as error:
            self.num_failures += 1
            logger.warning("lease mirror dropped %s: %r", op.key, error)

    def _ensure_worker(self) -> None:
        """Start the worker in the running loop (RuntimeError if there is none)."""
        loop = asyncio.get_running_loop()
        if self._queue is None:
            self._queue = asyncio.Queue(maxsize=self.max_pending)
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain_forever())

    async def _drain_forever(self) -> None:
        while True:
            op = await self._queue.get()
            try:
                async with asyncio.timeout(self.op_timeout_s):
                    await self._apply(op)
            except Exception as error:  # noqa: BLE001 - best effort, never raised
                self.num_failures += 1
                logger.warning("lease mirror failed on %s: %r", op.key, error)
            finally:
                self._queue.task_done()

    async def _apply(self, op: _MirrorOp) -> None:
        if op.payload is None:
            await self.redis.delete(op.key)
        else:
            await self.redis.set(op.key, op.payload, px=op.ttl_ms)


async def list_mirrored_leases(redis: Redis, namespace: ClusterNamespace) -> list[MirroredLease]:
    """Every mirrored lease of the namespace, sorted by (instance_id, request_id).

    Called by `pdserve status`; SCANs the ownership keys, then one pipelined GET + PTTL.
    """
    keys = [key async for key in redis.scan_iter(match=namespace.ownership_pattern(), count=500)]
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.get(key)
            pipe.pttl(key)
        replies = await pipe.execute()
    leases = []
    for payload, ttl_ms in zip(replies[0::2], replies[1::2]):
        if payload is None or ttl_ms < 0:
            continue  # expired or deleted between SCAN and GET
        fields = json.loads(payload)
        leases.append(MirroredLease(
            request_id=fields["request_id"],
            instance_id=fields["instance_id"],
            block_ids=tuple(fields["block_ids"]),
            remaining_s=ttl_ms / 1000,
        ))
    return sorted(leases, key=lambda lease: (lease.instance_id, lease.request_id))
