"""KVSender: the prefill side of a KV transfer; pushes KV blocks to a decode KVReceiver.

Used by the prefill service, from its asyncio event loop:

    sender = KVSender()
    result = await sender.send(address, request_id, kv_cache, layout, src_block_ids, dst_block_ids)

Each transfer runs the exchange in proto/pdserve/v1/kv_transfer.proto on a connection of its
own: connections are reused per destination address, but never shared by two transfers in
flight, so concurrent transfers cannot mix bytes. The payload is pipelined: the header goes
out first, then each chunk (shared.kv_transfer.ucx.chunks, ~`chunk_bytes` each) is gathered into a
staging buffer and posted while the chunks before it are still on the wire. A connection is
kept only after a COMPLETED transfer; one that
saw a rejection, an error or a timeout is aborted (the next transfer connects anew).
"""

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from shared.errors import InvalidRequestError
from shared.kv_cache.layout import KVCacheLayout
from shared.kv_transfer.address import parse_address
from shared.kv_transfer.ucx.chunks import (
    DEFAULT_CHUNK_BYTES, PayloadChunk, choose_rows_per_chunk, gather_chunk, message_view, plan_chunks, staging_bytes,
)
from shared.kv_transfer.ucx.env import ucxx
from shared.kv_transfer.ucx.framing import MAX_ACK_BYTES, PAYLOAD_TAG, recv_message, send_message
from shared.kv_transfer.ucx.header import build_header, check_kv_cache, find_block_id_problem
from shared.kv_transfer.ucx.inflight import keep_until_done
from shared.kv_transfer.ucx.protocol import KVTransferError, KVTransferRejected
from shared.kv_transfer.ucx.staging import DEFAULT_MAX_FREE_BYTES, StagingPool
from shared.kv_transfer.ucx.stats import TransferCounters, TransferResult, count_transfer
from shared.pb.pdserve.v1 import kv_transfer_pb2 as pb

logger = logging.getLogger(__name__)
_MAX_WIRE_BLOCK_ID = 2**32  # dst_block_ids are uint32 on the wire


def _check_send_arguments(
    request_id: str, kv_cache: torch.Tensor, layout: KVCacheLayout,
    src_block_ids: Sequence[int], dst_block_ids: Sequence[int],
) -> None:
    if not request_id:
        raise InvalidRequestError("request_id", "must not be empty")
    check_kv_cache(kv_cache, layout)
    for field, block_ids, num_blocks in (
        ("src_block_ids", src_block_ids, layout.num_blocks),
        ("dst_block_ids", dst_block_ids, _MAX_WIRE_BLOCK_ID),
    ):
        problem = find_block_id_problem(block_ids, num_blocks)
        if problem is not None:
            raise InvalidRequestError(field, problem)
    if len(src_block_ids) != len(dst_block_ids):
        raise InvalidRequestError(
            "dst_block_ids", f"{len(dst_block_ids)} ids for {len(src_block_ids)} src_block_ids"
        )


@dataclass(frozen=True)
class _OutgoingPayload:
    """What one transfer sends: which cache rows and blocks, in which chunks, through which staging buffer."""

    kv_cache: torch.Tensor
    layout: KVCacheLayout
    src_block_ids: np.ndarray
    chunks: list[PayloadChunk]
    has_crc32: bool
    staging: torch.Tensor


def _raise_unless_completed(ack: pb.KVTransferAck, request_id: str) -> None:
    """Turn a receiver's ack into nothing (COMPLETED), KVTransferRejected, or a protocol error."""
    if ack.request_id == request_id and ack.status == pb.KV_TRANSFER_STATUS_REJECTED:
        raise KVTransferRejected(ack.field or "receiver", ack.message)
    if ack.request_id != request_id or ack.status != pb.KV_TRANSFER_STATUS_COMPLETED:
        raise KVTransferError(
            "ack", f"expected COMPLETED for {request_id!r}, got "
            f"{pb.KVTransferStatus.Name(ack.status)} for {ack.request_id!r}"
        )


class KVSender:
    """Sends KV blocks to KVReceivers; one instance per process is enough.

    `use_checksum` ends every chunk with its CRC-32 (costs ~1 pass over the bytes on each side).
    `timeout_s` bounds one whole transfer, connection set-up included. `chunk_bytes` is the
    target chunk size (whole rows; at least one row per chunk). `max_staging_bytes` bounds the
    free staging buffers kept for reuse.
    """

    def __init__(
        self, use_checksum: bool = True, timeout_s: float = 30.0, max_idle_per_address: int = 8,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_staging_bytes: int = DEFAULT_MAX_FREE_BYTES,
    ):
        self._use_checksum = use_checksum
        self._chunk_bytes = chunk_bytes
        self._timeout_s = timeout_s
        self._max_idle_per_address = max_idle_per_address
        self._idle_endpoints: dict[str, list] = {}
        self.staging = StagingPool(max_staging_bytes)
        self.counters = TransferCounters()

    async def send(
        self, address: str, request_id: str, kv_cache: torch.Tensor, layout: KVCacheLayout,
        src_block_ids: Sequence[int], dst_block_ids: Sequence[int], transfer_token: bytes = b"",
        adapter_key: str = "",
    ) -> TransferResult:
        """Copy `kv_cache` blocks `src_block_ids[i]` into the receiver's `dst_block_ids[i]`,
        presenting the reservation's `transfer_token` and the LoRA adapter the KV was computed
        with (`adapter_key`, "" for the base model).

        Returns once the receiver has written them. Raises InvalidRequestError for bad
        arguments, KVTransferRejected when the receiver refuses (field named), and
        KVTransferError for "timeout" or a lost "connection".
        """
        _check_send_arguments(request_id, kv_cache, layout, src_block_ids, dst_block_ids)
        started = time.perf_counter()
        rows_per_chunk = choose_rows_per_chunk(layout, len(src_block_ids), self._chunk_bytes)
        header = build_header(request_id, layout, dst_block_ids, rows_per_chunk, self._use_checksum, transfer_token,
                              adapter_key)
        chunks = plan_chunks(layout, len(src_block_ids), rows_per_chunk, self._use_checksum)
        payload = _OutgoingPayload(
            kv_cache, layout, np.asarray(src_block_ids, dtype=np.int64), chunks, self._use_checksum,
            self.staging.acquire(staging_bytes(chunks)),
        )
        try:
            await self._send_on_own_endpoint(address, header, payload)
        except BaseException:
            self.counters.record_failure()
            raise
        return count_transfer(self.counters, header, time.perf_counter() - started, "sent", logger)

    @property
    def num_idle_endpoints(self) -> int:
        """Connections kept for reuse, over every receiver address (read from any thread)."""
        return sum(len(idle) for idle in list(self._idle_endpoints.values()))

    @property
    def num_idle_addresses(self) -> int:
        """Receiver addresses with a connection kept for reuse."""
        return sum(bool(idle) for idle in list(self._idle_endpoints.values()))

    async def close(self) -> None:
        """Close every idle connection (telling the receivers)."""
        endpoints = [endpoint for idle in self._idle_endpoints.values() for endpoint in idle]
        self._idle_endpoints.clear()
        for endpoint in endpoints:
            await endpoint.close()

    async def _send_on_own_endpoint(self, address: str, header: pb.KVTransferHeader, payload: _OutgoingPayload) -> None:
        """Run the exchange under the timeout; keep the endpoint only after a completed transfer."""
        endpoint = None
        try:
            async with asyncio.timeout(self._timeout_s):
                endpoint = await self._checkout(address)
                await self._exchange(endpoint, header, payload)
        except BaseException as error:
            self.staging.discard(payload.staging)  # UCX may still be reading it
            converted = self._as_transfer_error(error, header.request_id, address, is_connected=endpoint is not None)
            if converted is error:
                raise
            raise converted from error
        self._checkin(address, endpoint)
        self.staging.release(payload.staging)

    async def _exchange(self, endpoint, header: pb.KVTransferHeader, payload: _OutgoingPayload) -> None:
        """Post the ack receive and the header, then gather and post chunk after chunk; the ack decides.

        Each chunk is gathered while the ones before it are on the wire (UCX progresses them on
        its own thread). An early answer (a rejected header) stops the gathering. On anything
        but COMPLETED the endpoint is aborted, which cancels what is still pending.

        The operations are awaited through `asyncio.shield`: a timeout or a cancellation of this
        transfer must not reach them (awaiting a task directly, or a gather of them, cancels
        them with the awaiter), or their buffers would be freed while UCX still points into
        them; the abort ends them instead (see inflight).
        """
        ack = asyncio.ensure_future(recv_message(endpoint, pb.KVTransferAck, MAX_ACK_BYTES))
        pending = [ack, asyncio.ensure_future(send_message(endpoint, header))]
        sends = None
        try:
            for chunk in payload.chunks:
                if ack.done():
                    break
                pending.append(asyncio.ensure_future(self._send_chunk(endpoint, payload, chunk)))
                await asyncio.sleep(0)  # let the send be posted before gathering the next chunk
            _raise_unless_completed(await asyncio.shield(ack), header.request_id)
            sends = asyncio.gather(*pending[1:])
            await asyncio.shield(sends)
        except BaseException:
            endpoint.abort()
            # never cancelled: UCX may still use their buffers (see inflight)
            keep_until_done(pending if sends is None else [*pending, sends])
            raise

    @staticmethod
    async def _send_chunk(endpoint, payload: _OutgoingPayload, chunk: PayloadChunk) -> None:
        """Gather `chunk` into its place in the staging buffer, then send it as one message."""
        message = message_view(payload.staging, chunk)
        gather_chunk(payload.kv_cache, payload.layout, payload.src_block_ids, chunk, message, payload.has_crc32)
        await endpoint.send(message, tag=PAYLOAD_TAG)

    async def _checkout(self, address: str):
        """An idle live endpoint to `address`, or a new one."""
        idle = self._idle_endpoints.get(address, [])
        while idle:
            endpoint = idle.pop()
            if not endpoint.closed:
                return endpoint
        self._idle_endpoints.pop(address, None)  # no entry kept for an address that no longer answers
        host, port = parse_address(address)
        return await ucxx.create_endpoint(host, port)

    def _checkin(self, address: str, endpoint) -> None:
        idle = self._idle_endpoints.setdefault(address, [])
        if endpoint.closed or len(idle) >= self._max_idle_per_address:
            endpoint.abort()
        else:
            idle.append(endpoint)

    def _as_transfer_error(
        self, error: BaseException, request_id: str, address: str, is_connected: bool
    ) -> BaseException:
        """Name what went wrong: no connection, timeout, lost connection; other errors pass through."""
        if isinstance(error, TimeoutError) and not is_connected:
            return KVTransferError(
                "connection", f"request {request_id!r}: cannot connect to {address} within {self._timeout_s} s"
            )
        if isinstance(error, TimeoutError):
            return KVTransferError(
                "timeout", f"request {request_id!r} to {address}: no answer within {self._timeout_s} s"
            )
        if isinstance(error, ucxx.exceptions.UCXError):
            return KVTransferError("connection", f"request {request_id!r} to {address}: {error}")
        return error
