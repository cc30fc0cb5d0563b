"""Decode: Reserve (admission under a lease), Decode (stream from the prefill's first token),
Release, on the KV blocks that the prefill instance pushes into this instance's cache through
the engine's KV connector (UCX).

PrefillLocally computes a reservation's prompt here instead of receiving its KV (conditional
disaggregation; services.decode.local_prefill) and streams like Decode.

Reserve refuses at once with RESOURCE_EXHAUSTED when the engine has no room, so the gateway
can try another instance. Decode needs the transfer to have completed (FAILED_PRECONDITION
before that, NOT_FOUND for an unknown or expired reservation). A Decode stream that is
cancelled or runs past its deadline aborts the request, which frees its blocks. When a drain
runs out of time, `hand_back` aborts the streams still decoding and their Decode calls fail
UNAVAILABLE (health is NOT_SERVING by then): the gateway migrates them to another instance.
"""

import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from shared.cluster.leases import LeaseTable
from shared.engine_api.client import GenerateRequest
from shared.engine_api.outputs import FinishReason
from shared.errors import InvalidRequestError
from shared.pb.pdserve.v1 import generation_pb2, instance_pb2 as pb
from shared.tracing import span
from shared.wire.handback import handed_back_message, handed_back_trailer
from shared.wire.outputs import logprobs_from_proto, request_output_to_protos
from shared.wire.sampling import sampling_from_proto
from services.rpc.errors import ServiceError
from services.instance.role import RoleHandler
from services.decode.local_prefill import LocalPrefillBudget
from services.decode.leases import ReservationLeases

logger = logging.getLogger(__name__)


class DecodeHandler(RoleHandler):
    def __init__(self, runtime):
        self.engine = runtime.engine
        self.adapters = runtime.adapters
        self.default_lease_ms = runtime.settings.lease_ms
        leases = LeaseTable(runtime.instance_id, mirror=runtime.presence.lease_mirror)
        runtime.presence.resync_hooks.append(leases.republish)
        self.leases = ReservationLeases(runtime.engine, leases)
        self.local_prefills = LocalPrefillBudget(runtime.settings.max_local_prefill_tokens)
        self._decoding: set[str] = set()  # request ids whose Decode (or PrefillLocally) stream is open
        self._is_handing_back = False

    async def stop(self) -> None:
        await self.leases.release_all()

    def add_status(self, status: pb.InstanceStatus) -> None:
        status.num_lease_expiries += self.leases.num_lease_expiries
        status.num_local_prefills += self.local_prefills.num_admitted
        status.num_local_prefills_refused += self.local_prefills.num_refused

    async def on_engine_restart(self) -> None:
        self.leases.forget_all()

    async def reserve(self, request: pb.ReserveRequest,
                      caller_is_gone: Callable[[], bool] = lambda: False) -> pb.ReserveResponse:
        """Reserve blocks; if the caller's deadline passed meanwhile (its reply would be lost and
        nobody would release), they are freed at once instead of at lease expiry."""
        if not request.request_id:
            raise InvalidRequestError("request_id", "must not be empty")
        salt = request.cache_salt if request.HasField("cache_salt") else None
        lease_s = (request.lease_ms or self.default_lease_ms) / 1000
        generate = GenerateRequest(request.request_id, tuple(request.prompt_token_ids),
                                   sampling_from_proto(request.sampling), salt, request.num_resumed_output_tokens,
                                   lora_request=self.adapters.resolve(request))
        reservation = await self.leases.reserve(generate, lease_s)
        if caller_is_gone():
            await self.leases.release(request.request_id)
            raise ServiceError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"the caller of Reserve {request.request_id!r} is gone; reservation released")
        logger.info("reserved %s: %d blocks (%d prompt tokens cached), lease %.1f s", request.request_id,
                    len(reservation.block_ids), reservation.num_cached_tokens, lease_s)
        return pb.ReserveResponse(ucx_address=reservation.transfer_address, block_ids=reservation.block_ids,
                                  num_cached_prompt_tokens=reservation.num_cached_tokens,
                                  num_skip_blocks=reservation.num_skip_blocks,
                                  transfer_token=reservation.transfer_token)

    async def decode(self, request: pb.DecodeRequest) -> AsyncIterator[generation_pb2.GenerateResponse]:
        vocab_size = self.engine.info.vocab_size
        if request.first_token_id >= vocab_size:
            raise InvalidRequestError("first_token_id", f"{request.first_token_id} is outside the vocabulary "
                                                        f"[0, {vocab_size})")
        with span("decode.wait_kv"):
            await self.leases.wait_for_kv(request.request_id)
        self.leases.take(request.request_id)
        first_logprobs = logprobs_from_proto(request.first_logprobs) if request.HasField("first_logprobs") else None
        stream = self.engine.generate_reserved(request.request_id, request.first_token_id, first_logprobs)
        async for message in self._relay(request.request_id, stream, with_prompt_logprobs=False):
            yield message

    async def prefill_locally(self, request: pb.LocalPrefillRequest) -> AsyncIterator[generation_pb2.GenerateResponse]:
        """Compute the reservation's prompt here, then decode; refused (RESOURCE_EXHAUSTED, the
        reservation untouched) when the local-prefill budget has no room for it."""
        num_tokens = self.leases.get(request.request_id).num_uncached_tokens
        self.local_prefills.take(num_tokens)
        holds_budget = True
        try:
            self.leases.take(request.request_id)
            logger.info("local prefill %s: %d uncached prompt tokens", request.request_id, num_tokens)
            stream = self.engine.prefill_reserved(request.request_id)
            async for message in self._relay(request.request_id, stream, with_prompt_logprobs=True):
                if holds_budget and message.token_ids:  # the prompt is computed
                    self.local_prefills.give_back(num_tokens)
                    holds_budget = False
                yield message
        finally:
            if holds_budget:
                self.local_prefills.give_back(num_tokens)

    async def _relay(self, request_id: str, stream: AsyncIterator,
                     with_prompt_logprobs: bool) -> AsyncIterator[generation_pb2.GenerateResponse]:
        """A started reservation's outputs as messages (prompt logprobs once, when asked for)."""
        self._decoding.add(request_id)
        num_tokens = 0
        try:
            with span("decode.engine", {"pdserve.request_id": request_id}) as engine_span:
                async with contextlib.aclosing(stream) as outputs:
                    async for output in outputs:
                        self._raise_if_handed_back(request_id, output)
                        num_tokens = _note_output(engine_span, output, num_tokens)
                        messages = request_output_to_protos(output, with_prompt_logprobs=with_prompt_logprobs)
                        with_prompt_logprobs = with_prompt_logprobs and not messages
                        for message in messages:
                            yield message
        finally:
            self._decoding.discard(request_id)

    async def hand_back(self) -> None:
        self._is_handing_back = True
        for request_id in list(self._decoding):
            await self.engine.abort(request_id)

    def _raise_if_handed_back(self, request_id: str, output) -> None:
        if self._is_handing_back and output.finished and output.outputs[0].finish_reason == FinishReason.ABORT:
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, handed_back_message(request_id),
                               handed_back_trailer(request_id))

    async def release(self, request: pb.ReleaseRequest) -> pb.ReleaseResponse:
        if not await self.leases.release(request.request_id):
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no reservation for {request.request_id!r} to release")
        logger.info("released %s", request.request_id)
        return pb.ReleaseResponse(released=True)

    async def renew(self, request: pb.RenewRequest) -> pb.RenewResponse:
        lease_s = (request.lease_ms or self.default_lease_ms) / 1000
        if not await self.leases.renew(request.request_id, lease_s):
            raise ServiceError(grpc.StatusCode.NOT_FOUND, f"no reservation for {request.request_id!r} to renew "
                                                          "(released, expired, or already decoding)")
        return pb.RenewResponse(renewed=True)


def _note_output(engine_span, output, num_tokens: int) -> int:
    """The decode span's first token and finish (reason, token counts); the tokens so far."""
    completion = output.outputs[0]
    if not num_tokens and completion.token_ids:
        engine_span.add_event("first_token")
    num_tokens = len(completion.token_ids)
    if output.finished:
        engine_span.set_attributes({"pdserve.finish_reason": completion.finish_reason or "none",
                                    "pdserve.num_generated_tokens": num_tokens,
                                    "pdserve.num_prompt_tokens": len(output.prompt_token_ids)})
    return num_tokens
