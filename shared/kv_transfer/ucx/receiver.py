"""KVReceiver: the decode side of a KV transfer; receives KV blocks straight into its paged cache.

Used by the decode service, from its asyncio event loop:

    receiver = KVReceiver(kv_cache, layout)
    address = await receiver.start()              # "host:port", handed to the prefill side
    receiver.expect(request_id, dst_block_ids)    # before telling prefill to send
    result = await receiver.wait(request_id, timeout_s=5.0)   # TransferResult or KVTransferError

or, for an engine's KV connector, an expectation that lasts until withdrawn and reports the
end of every transfer into it (a retry after a failure, or a second copy after a success):

    receiver.expect(request_id, dst_block_ids, token, on_outcome=report)   # report(result or error)
    receiver.withdraw(request_id)

Each connection (ucxx endpoint) serves one transfer at a time, following the message order in
proto/pdserve/v1/kv_transfer.proto; concurrent transfers arrive on separate endpoints (the
sender opens one per transfer in flight), so their bytes can never mix. The payload arrives
in chunks (shared.kv_transfer.ucx.chunks): all their receives are posted at once, into one staging
buffer, and each chunk is verified and written into the cache as soon as it is in, while the
next ones arrive. A header rejected up front is answered at once, its payload received into
scratch memory and dropped, and its connection ends. The cache is written only by
`scatter_chunk`, run synchronously on the event loop right after checking that the request
is still expected, so a request withdrawn (e.g. by a timeout) is never written again. A chunk
that fails its checksum stops the transfer: chunks before it may already be in the
destination blocks, which stay the caller's to free or to fill by a retried transfer.

A transfer whose sender stalled (a partition, a sender that gave up on its timeout and went
quiet) would keep its request "in flight" for as long as its connection looks open, which over
a partition can be forever. So a new header for the same request, with the reservation's token,
supersedes it: the stalled transfer's connection is aborted, it writes no further chunk (each
write checks that its transfer is still the current one), and the retry is received in full.
Withdrawing a request also aborts the connection of a transfer still in flight for it.
"""

import asyncio
import logging
import hmac
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from shared.errors import InvalidRequestError
from shared.kv_cache.layout import KVCacheLayout
from shared.kv_transfer.ucx.chunks import (
    CRC32_TRAILER_BYTES, PayloadChunk, chunk_crc32_problem, message_view, plan_chunks, scatter_chunk, staging_bytes,
)
from shared.kv_transfer.ucx.env import ucxx
from shared.kv_transfer.ucx.framing import MAX_HEADER_BYTES, PAYLOAD_TAG, recv_message, send_message
from shared.kv_transfer.ucx.header import (adapter_mismatch, as_numpy_bytes, check_kv_cache, find_block_id_problem,
                                           validate_header)
from shared.kv_transfer.ucx.inflight import keep_until_done
from shared.kv_transfer.ucx.protocol import KVTransferError
from shared.kv_transfer.ucx.staging import DEFAULT_MAX_FREE_BYTES, StagingPool
from shared.kv_transfer.ucx.stats import LateWriteRefusals, TransferCounters, TransferResult, count_transfer
from shared.pb.pdserve.v1 import kv_transfer_pb2 as pb

logger = logging.getLogger(__name__)
TOKEN_FIELD = "transfer_token"
DEFAULT_DISCARD_TIMEOUT_S = 5.0  # how long a rejected transfer's payload may take to arrive and be dropped


@dataclass
class _ExpectedTransfer:
    """A transfer the decode side is waiting for; lives from `expect` until `wait` returns."""

    request_id: str
    dst_block_ids: tuple[int, ...]
    outcome: asyncio.Future
    transfer_token: bytes = b""  # empty: no token required
    adapter_key: str = ""  # the reservation's LoRA adapter; empty: the base model
    is_in_flight: bool = False
    is_withdrawn: bool = False
    generation: int = 0  # bumped by every admitted transfer: a superseded one writes no more
    endpoint: object = None  # the connection of the transfer in flight
    # Told of every transfer's end until withdrawn (None: one transfer, awaited with `wait`).
    on_outcome: "Callable[[TransferResult | KVTransferError], None] | None" = None

    def is_current(self, generation: int) -> bool:
        """Whether the transfer admitted as `generation` may still write."""
        return self.generation == generation and not self.is_withdrawn


def _ack(request_id: str, status: int, error: KVTransferError | None = None) -> pb.KVTransferAck:
    if error is None:
        return pb.KVTransferAck(request_id=request_id, status=status)
    return pb.KVTransferAck(request_id=request_id, status=status, field=error.field, message=error.message)


class KVReceiver:
    """Listens for KV transfers and writes accepted payloads into `kv_cache`.

    `host` is the address advertised to senders (ucxx listeners accept on all interfaces);
    `port=0` lets the OS pick a free port. `verify_checksum=False` skips the per-chunk CRC-32
    check even when the sender supplies one. `max_staging_bytes` bounds the free staging
    buffers kept for reuse. `discard_timeout_s` bounds how long a rejected transfer's payload
    is drained (so that the answer reaches its sender) before its connection is dropped.
    """

    def __init__(
        self, kv_cache: torch.Tensor, layout: KVCacheLayout, host: str = "127.0.0.1", port: int = 0,
        verify_checksum: bool = True, max_staging_bytes: int = DEFAULT_MAX_FREE_BYTES,
        discard_timeout_s: float = DEFAULT_DISCARD_TIMEOUT_S,
    ):
        check_kv_cache(kv_cache, layout)
        self._kv_cache = kv_cache
        self._layout = layout
        self._host = host
        self._port = port
        self._verify_checksum_enabled = verify_checksum
        self._discard_timeout_s = discard_timeout_s
        self._expected: dict[str, _ExpectedTransfer] = {}
        self._endpoints: set = set()
        self.staging = StagingPool(max_staging_bytes)
        self._listener = None
        self.counters = TransferCounters()
        self.late_writes_refused = LateWriteRefusals()

    async def start(self) -> str:
        """Start listening; returns `address`."""
        self._listener = ucxx.create_listener(self._serve_endpoint, port=self._port)
        logger.info("KV receiver listening on %s", self.address)
        return self.address

    @property
    def address(self) -> str:
        """"host:port" for KVSender.send; valid after `start`."""
        if self._listener is None:
            raise RuntimeError("KVReceiver.start() has not been awaited")
        return f"{self._host}:{self._listener.port}"

    def expect(self, request_id: str, dst_block_ids: Sequence[int], transfer_token: bytes = b"",
               adapter_key: str = "",
               on_outcome: Callable[[TransferResult | KVTransferError], None] | None = None) -> None:
        """Register a transfer for `request_id` into `dst_block_ids` (already reserved by the caller).

        Call from the event loop before the sender starts. A header for any other request id,
        with other block ids, or (when `transfer_token` is given) without that token, is rejected;
        a header with a wrong token leaves the expectation untouched for the real sender. A header
        with the right token whose KV was computed with another LoRA adapter than `adapter_key`
        ("" for the base model) is rejected and fails the expectation (field "adapter_key").
        With `on_outcome`, the expectation lasts until `withdraw`: the end of every transfer into
        it is passed to `on_outcome` (on the event loop), and a later transfer is accepted after
        one completed or failed; without, one outcome is awaited with `wait`.
        """
        if not request_id:
            raise InvalidRequestError("request_id", "must not be empty")
        if request_id in self._expected:
            raise InvalidRequestError("request_id", f"{request_id!r} is already expected")
        problem = find_block_id_problem(dst_block_ids, self._layout.num_blocks)
        if problem is not None:
            raise InvalidRequestError("dst_block_ids", problem)
        outcome = asyncio.get_running_loop().create_future()
        self._expected[request_id] = _ExpectedTransfer(request_id, tuple(dst_block_ids), outcome, transfer_token,
                                                       adapter_key, on_outcome=on_outcome)

    async def wait(self, request_id: str, timeout_s: float | None) -> TransferResult:
        """Wait for `request_id`'s blocks to be written; always withdraws the expectation.

        Raises KVTransferError: the sender's or receiver's rejection (field named), or
        field "timeout" when nothing complete arrived within `timeout_s` seconds (None: no
        timeout; the decode side's reservation book relies on its lease instead).
        """
        expected = self._expected.get(request_id)
        if expected is None:
            raise InvalidRequestError("request_id", f"{request_id!r} is not expected")
        if expected.on_outcome is not None:
            raise InvalidRequestError("request_id", f"{request_id!r} reports its transfers to a listener")
        try:
            return await asyncio.wait_for(asyncio.shield(expected.outcome), timeout_s)
        except asyncio.TimeoutError:
            raise KVTransferError(
                "timeout", f"request {request_id!r}: no complete transfer within {timeout_s} s"
            ) from None
        finally:
            self.withdraw(request_id)

    def withdraw(self, request_id: str, reason: str = "was withdrawn") -> None:
        """Stop expecting `request_id`; a transfer still in flight for it is rejected, not written.

        A caller still waiting on it gets KVTransferError("request_id", f"{request_id!r} {reason}").
        """
        expected = self._expected.pop(request_id, None)
        if expected is None:
            return
        expected.is_withdrawn = True
        if expected.is_in_flight and expected.endpoint is not None and not expected.endpoint.closed:
            expected.endpoint.abort()  # its pending receives end; nothing more is written
        if not expected.outcome.done():
            expected.outcome.set_exception(KVTransferError("request_id", f"{request_id!r} {reason}"))
        expected.outcome.exception()  # counts as retrieved even if nobody waits; waiters still see it

    async def close(self, drain_timeout_s: float = 1.0) -> None:
        """Withdraw every pending expectation, drop open connections, then stop listening.

        Waits up to `drain_timeout_s` for the per-connection handlers to notice and return.
        """
        for request_id in list(self._expected):
            self.withdraw(request_id, "was withdrawn: the receiver closed")
        for endpoint in list(self._endpoints):
            endpoint.abort()
        if self._listener is None:
            return
        deadline = time.monotonic() + drain_timeout_s
        while self._listener.active_clients > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        self._listener.close()

    async def _serve_endpoint(self, endpoint) -> None:
        """ucxx calls this once per sender connection; serves transfers until the peer goes away."""
        self._endpoints.add(endpoint)
        try:
            while not endpoint.closed and await self._serve_one_transfer(endpoint):
                pass
        except (ucxx.exceptions.UCXError, KVTransferError) as error:
            logger.debug("KV receiver: connection ended: %s", error)
        finally:
            self._endpoints.discard(endpoint)
            if not endpoint.closed:
                endpoint.abort()

    async def _serve_one_transfer(self, endpoint) -> bool:
        """Header, payload chunks, then one ack (see the .proto); returns whether the connection goes on."""
        header = await recv_message(endpoint, pb.KVTransferHeader, MAX_HEADER_BYTES)
        started = time.perf_counter()
        try:
            expected = self._admit(header, endpoint)
        except KVTransferError as error:
            await self._reject(endpoint, header, error)
            await self._drain_payload(endpoint, header)
            return False
        generation = expected.generation
        chunks = plan_chunks(self._layout, header.num_blocks, header.rows_per_chunk, header.has_chunk_crc32)
        staging = self.staging.acquire(staging_bytes(chunks))
        receives = [
            asyncio.ensure_future(endpoint.recv(message_view(staging, chunk), tag=PAYLOAD_TAG)) for chunk in chunks
        ]
        try:
            await self._write_chunks_as_they_arrive(header, expected, generation, staging, chunks, receives)
        except KVTransferError as error:
            self._end_flight(expected, generation)
            if endpoint.closed:  # superseded or withdrawn: its connection is already cut
                return False
            await self._reject(endpoint, header, error)
            await asyncio.wait(receives, timeout=self._discard_timeout_s)  # the sender stops on our answer
            return False
        finally:
            self._end_flight(expected, generation)
            self._settle_staging(staging, receives)
        result = count_transfer(self.counters, header, time.perf_counter() - started, "received", logger)
        self._report(expected, result)
        await send_message(endpoint, _ack(header.request_id, pb.KV_TRANSFER_STATUS_COMPLETED))
        return True

    async def _write_chunks_as_they_arrive(
        self, header: pb.KVTransferHeader, expected: _ExpectedTransfer, generation: int, staging: torch.Tensor,
        chunks: list[PayloadChunk], receives: list[asyncio.Future],
    ) -> None:
        """Verify and scatter chunk i once it is in, with no await between the check and the write.

        A lost connection fails the waiter ("connection", unless a retry superseded this
        transfer) and re-raises the UCX error.
        """
        dst_block_ids = np.asarray(expected.dst_block_ids, dtype=np.int64)
        for chunk, receive in zip(chunks, receives):
            try:
                await receive
            except ucxx.exceptions.UCXError as error:
                if expected.generation == generation:
                    self._end_flight(expected, generation)
                    self._fail_expected(header.request_id, KVTransferError("connection", f"lost mid-payload: {error}"))
                raise
            message = message_view(staging, chunk)
            if header.has_chunk_crc32 and self._verify_checksum_enabled:
                problem = chunk_crc32_problem(message, chunk)
                if problem is not None:
                    raise KVTransferError("chunk_crc32", problem)
            if expected.is_withdrawn:
                self.late_writes_refused.withdrawn += 1
                raise KVTransferError("request_id", f"{header.request_id!r} was withdrawn by the receiver")
            if not expected.is_current(generation):
                self.late_writes_refused.superseded += 1
                raise KVTransferError("request_id", f"a newer transfer for {header.request_id!r} superseded this one")
            scatter_chunk(message, self._kv_cache, self._layout, dst_block_ids, chunk)

    def _settle_staging(self, staging: torch.Tensor, receives: list[asyncio.Future]) -> None:
        """Reuse the staging buffer only if UCX is done with it. Receives still pending are never
        cancelled (that would free the memory UCX writes into): they are kept, with the staging
        memory their views hold, until the endpoint's abort ends them (shared.kv_transfer.ucx.inflight)."""
        if all(receive.done() for receive in receives):
            self.staging.release(staging)
            return
        keep_until_done(receives)
        self.staging.discard(staging)  # never reused; freed once the last receive lets go

    async def _reject(self, endpoint, header: pb.KVTransferHeader, error: KVTransferError) -> None:
        """Tell the waiter (if any) and the sender why; the connection ends after this transfer.
        A sender without the reservation's token cannot disturb the waiter."""
        if error.field != TOKEN_FIELD:
            self._fail_expected(header.request_id, error)
        else:
            self.counters.record_failure()
        logger.warning("KV transfer %r rejected: %s", header.request_id, error)
        await send_message(endpoint, _ack(header.request_id, pb.KV_TRANSFER_STATUS_REJECTED, error))

    async def _drain_payload(self, endpoint, header: pb.KVTransferHeader) -> None:
        """Receive and drop the chunks of a header rejected up front, so our answer reaches the sender.

        Stops early when the sender, having read the answer, drops the connection. Headers too
        broken to say how many chunks follow, or larger than any real transfer, are not drained.
        """
        num_sender_rows = 2 * header.num_layers
        if not 1 <= header.rows_per_chunk <= num_sender_rows or header.payload_bytes % num_sender_rows:
            return
        if header.payload_bytes > self._layout.num_blocks * self._layout.bytes_per_block:
            return
        num_chunks = len(range(0, num_sender_rows, header.rows_per_chunk))
        chunk_bytes = header.payload_bytes // num_sender_rows * header.rows_per_chunk
        scratch = self.staging.acquire(chunk_bytes + CRC32_TRAILER_BYTES)  # every chunk message fits
        deadline = time.monotonic() + self._discard_timeout_s
        receives: list[asyncio.Future] = []
        try:
            for _ in range(num_chunks):
                receives.append(asyncio.ensure_future(endpoint.recv(as_numpy_bytes(scratch), tag=PAYLOAD_TAG)))
                await asyncio.wait(receives[-1:], timeout=max(0.0, deadline - time.monotonic()))
                if not receives[-1].done():
                    logger.debug("KV transfer %r: payload not drained in time", header.request_id)
                    return
                receives[-1].result()
        except ucxx.exceptions.UCXError as drain_error:
            logger.debug("KV transfer %r: payload not drained: %s", header.request_id, drain_error)
        finally:
            keep_until_done(receives)  # never cancelled: UCX may still write into scratch
            self.staging.discard(scratch)  # never reused; a pending receive keeps it alive

    def _admit(self, header: pb.KVTransferHeader, endpoint) -> _ExpectedTransfer:
        """Check `header` against the layout and the expected transfers; marks it in flight, as
        the current transfer (superseding a stalled one)."""
        validate_header(header, self._layout)
        expected = self._expected.get(header.request_id)
        if expected is None:
            self.late_writes_refused.not_expected += 1
            raise KVTransferError("request_id", f"no transfer expected for {header.request_id!r}")
        if expected.transfer_token and not hmac.compare_digest(header.transfer_token, expected.transfer_token):
            raise KVTransferError(TOKEN_FIELD, "missing or wrong for this reservation")
        mismatch = adapter_mismatch(header.adapter_key, expected.adapter_key)
        if mismatch is not None:
            raise KVTransferError("adapter_key", mismatch)
        if expected.on_outcome is None and expected.outcome.done():
            raise KVTransferError("request_id", f"a transfer for {header.request_id!r} is already done")
        if tuple(header.dst_block_ids) != expected.dst_block_ids:
            raise KVTransferError(
                "dst_block_ids", f"sender {list(header.dst_block_ids)}, receiver {list(expected.dst_block_ids)}"
            )
        if expected.is_in_flight:
            self._supersede(expected)
        expected.is_in_flight = True
        expected.generation += 1
        expected.endpoint = endpoint
        return expected

    def _supersede(self, expected: _ExpectedTransfer) -> None:
        """A retry arrived while an earlier transfer for the request is still in flight (its
        sender gave up, or stalled): the earlier one writes no more and its connection goes."""
        logger.warning("KV transfer %r: a retry supersedes the transfer still in flight", expected.request_id)
        expected.generation += 1
        stalled = expected.endpoint
        if stalled is not None and not stalled.closed:
            stalled.abort()

    @staticmethod
    def _end_flight(expected: _ExpectedTransfer, generation: int) -> None:
        """The transfer admitted as `generation` is over; unless a retry superseded it, the
        request is no longer in flight."""
        if expected.generation == generation:
            expected.is_in_flight = False
            expected.endpoint = None

    def _fail_expected(self, request_id: str, error: KVTransferError) -> None:
        """Report a rejection to whoever waits on `request_id`, unless another transfer for it is running."""
        self.counters.record_failure()
        expected = self._expected.get(request_id)
        if expected is not None and not expected.is_in_flight:
            self._report(expected, error)

    @staticmethod
    def _report(expected: _ExpectedTransfer, outcome: TransferResult | KVTransferError) -> None:
        """A transfer into `expected` ended: tell its listener, or settle its one outcome."""
        if expected.on_outcome is not None:
            if not expected.is_withdrawn:
                expected.on_outcome(outcome)
        elif not expected.outcome.done():
            if isinstance(outcome, KVTransferError):
                expected.outcome.set_exception(outcome)
            else:
                expected.outcome.set_result(outcome)
