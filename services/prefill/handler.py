"""Prefill: compute a prompt's KV here, sample its first token, push the blocks to a decode instance.

The prompt runs in the engine under `<request_id>:prefill` (so a colocated instance can prefill
into its own reservation of `<request_id>`) with max_tokens=1 and no stop strings (the decode side applies those), and
its blocks are held past the request's end so they can be shipped; they are released in a
`finally` whatever happens: success, a failed transfer, cancellation or deadline. Blocks the
decode instance already holds (its prefix cache: the first `num_skip_blocks`) are not sent.
A request with no destination (no decode address, no block ids) is prompt-only: the prompt is
scored (first token, prompt logprobs) and nothing is sent, e.g. for an OpenAI echo with
max_tokens 0.
"""

import dataclasses
import logging

import grpc

from shared.core.kv_cache_manager import blocks_for_tokens
from shared.engine.outputs import RequestOutput
from shared.errors import InvalidRequestError
from shared.pb.pdserve.v1 import instance_pb2 as pb
from shared.sampling.params import SamplingParams
from shared.transfer.ucx_transport import KVSender, KVTransferError, TransferResult, parse_address
from shared.wire.outputs import logprobs_to_proto
from shared.wire.sampling import sampling_from_proto
from services.common.errors import ServiceError
from services.common.role import RoleHandler

logger = logging.getLogger(__name__)

ENGINE_ID_SUFFIX = ":prefill"
MIB = 1 << 20


def prefill_params(params: SamplingParams, num_resumed: int = 0) -> SamplingParams:
    """The user's parameters for the first token only (the first after `num_resumed` outputs
    generated elsewhere, for a migrated request)."""
    if params.n != 1:
        raise InvalidRequestError("n", "disaggregated requests generate one completion each")
    num_outputs = num_resumed + 1
    return dataclasses.replace(params, max_tokens=num_outputs, min_tokens=min(params.min_tokens, num_outputs),
                               stop=[])


def check_transfer_request(request: pb.PrefillRequest, block_size: int) -> None:
    """The destination must name one block per prompt block, and leave at least one to send."""
    if not request.request_id:
        raise InvalidRequestError("request_id", "must not be empty")
    if not request.prompt_token_ids:
        raise InvalidRequestError("prompt_token_ids", "must not be empty")
    if is_prompt_only(request):
        return
    try:
        parse_address(request.decode_ucx_address)
    except InvalidRequestError as error:
        raise InvalidRequestError("decode_ucx_address", error.message) from None
    num_blocks = blocks_for_tokens(len(request.prompt_token_ids), block_size)
    if len(request.dst_block_ids) != num_blocks:
        raise InvalidRequestError("dst_block_ids", f"{len(request.dst_block_ids)} ids for a prompt of "
                                                   f"{num_blocks} blocks of {block_size} tokens")
    if request.num_skip_blocks >= num_blocks:
        raise InvalidRequestError("num_skip_blocks", f"{request.num_skip_blocks} leaves none of the "
                                                     f"{num_blocks} prompt blocks to send")


def is_prompt_only(request: pb.PrefillRequest) -> bool:
    """No destination: score the prompt, send nothing."""
    return not request.decode_ucx_address and not request.dst_block_ids


def prefill_response(request: pb.PrefillRequest, output: RequestOutput, sent: TransferResult) -> pb.PrefillResponse:
    completion = output.outputs[0]
    first_token_id = completion.token_ids[0]
    response = pb.PrefillResponse(
        first_token_id=first_token_id, num_cached_prompt_tokens=output.num_cached_tokens,
        num_computed_prompt_tokens=len(request.prompt_token_ids) - output.num_cached_tokens,
        kv_bytes_sent=sent.num_bytes, kv_transfer_seconds=sent.seconds)
    if completion.logprobs:
        response.first_logprobs.CopyFrom(logprobs_to_proto(first_token_id, completion.logprobs[0]))
    if output.prompt_logprobs:
        prompt = output.prompt_token_ids
        response.prompt_logprobs.extend(logprobs_to_proto(prompt[i + 1], entry)
                                        for i, entry in enumerate(output.prompt_logprobs))
    return response


class PrefillHandler(RoleHandler):
    def __init__(self, runtime, sender: KVSender | None = None):
        self.async_engine = runtime.async_engine
        self.sender = sender or KVSender(max_staging_bytes=int(runtime.settings.kv_staging_max_mb * MIB))

    async def stop(self) -> None:
        await self.sender.close()

    def add_status(self, status: pb.InstanceStatus) -> None:
        status.kv_bytes_transferred += self.sender.counters.total_bytes
        status.kv_transfer_seconds += self.sender.counters.total_seconds

    async def prefill(self, request: pb.PrefillRequest) -> pb.PrefillResponse:
        engine = self.async_engine.engine
        check_transfer_request(request, engine.kv_manager.block_size)
        num_resumed = request.num_resumed_output_tokens
        params = prefill_params(sampling_from_proto(request.sampling), num_resumed)
        engine_request_id = f"{request.request_id}{ENGINE_ID_SUFFIX}"
        try:
            output = await self._run_prompt(request, engine_request_id, params, num_resumed)
            sent = (TransferResult(request.request_id, 0, 0.0) if is_prompt_only(request)
                    else await self._push_blocks(request, engine_request_id))
        finally:
            self.async_engine.submit(engine.release_request, engine_request_id)
        logger.info("prefill %s: %d prompt tokens (%d cached), %d KV bytes to %s in %.1f ms", request.request_id,
                    len(request.prompt_token_ids), output.num_cached_tokens, sent.num_bytes,
                    request.decode_ucx_address, sent.seconds * 1e3)
        return prefill_response(request, output, sent)

    async def _run_prompt(self, request: pb.PrefillRequest, engine_request_id: str,
                          params: SamplingParams, num_resumed: int) -> RequestOutput:
        engine = self.async_engine.engine
        salt = request.cache_salt if request.HasField("cache_salt") else None
        await self.async_engine.prepare(params)

        def add() -> None:  # returns nothing: AsyncEngine.generate dispatches a returned list as outputs
            engine.add_request(list(request.prompt_token_ids), params, engine_request_id, salt,
                               hold_blocks_on_finish=True, num_resumed_output_tokens=num_resumed)

        output = None
        async for output in self.async_engine.generate(engine_request_id, add):
            pass
        if output is None or output.outputs[0].finish_reason == "abort" or not output.outputs[0].token_ids:
            raise ServiceError(grpc.StatusCode.ABORTED, f"prefill of {request.request_id!r} was aborted")
        return output

    async def _push_blocks(self, request: pb.PrefillRequest, engine_request_id: str) -> TransferResult:
        engine = self.async_engine.engine
        block_ids = await self.async_engine.call(engine.held_block_ids, engine_request_id)
        skip = request.num_skip_blocks
        executor = engine.executor
        try:
            source, layout, src_block_ids = executor.blocks_for_send(block_ids[skip:])
            return await self.sender.send(request.decode_ucx_address, request.request_id, source, layout,
                                          src_block_ids, list(request.dst_block_ids)[skip:],
                                          request.transfer_token)
        except KVTransferError as error:
            raise ServiceError(grpc.StatusCode.ABORTED, f"KV transfer of {request.request_id!r} to "
                                                        f"{request.decode_ucx_address} failed: {error}") from error
