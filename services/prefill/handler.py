"""Prefill: compute a prompt's KV here, sample its first token, push the blocks to a decode instance.

The prompt runs in the engine under `<request_id>:prefill` (so a colocated instance can prefill
into its own reservation of `<request_id>`) with max_tokens=1 and no stop strings (the decode
side applies those), and with `kv_send`: the engine's KV connector ships the blocks to the
decode instance, keeps them until the send ended, then frees them whatever happened (success,
a failed transfer, cancellation or deadline); the final output says what moved. Blocks the
decode instance already holds (its prefix cache: the first `num_skip_blocks`) are not sent.
A request with no destination (no decode address, no block ids) is prompt-only: the prompt is
scored (first token, prompt logprobs) and nothing is sent, e.g. for an OpenAI echo with
max_tokens 0.

StreamPrefill (the gateway's path) answers twice: the first token as the client gets it, as
soon as the engine sampled it (its KV still travelling; services.prefill.first_token), then
the outcome. Both answers say when the completion ends with the first token, so that the
gateway needs no Decode for it.
"""

import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator

import grpc

from shared.engine_api.client import GenerateRequest, KVSendParams, KVTransferFailedError, KVTransferResult
from shared.engine_api.outputs import FinishReason, RequestOutput
from shared.errors import InvalidRequestError
from shared.kv_cache.blocks import blocks_for_tokens
from shared.kv_transfer.address import parse_address
from shared.pb.pdserve.v1 import instance_pb2 as pb
from shared.sampling.params import SamplingParams
from shared.tracing import record_failure, span
from shared.wire.outputs import logprobs_to_proto
from shared.wire.sampling import sampling_from_proto
from services.rpc.errors import ServiceError
from services.instance.role import RoleHandler
from services.prefill.first_token import FirstTokenText, add_ending, ending, first_token_message
from services.prefill.peer_pull import PeerPuller

logger = logging.getLogger(__name__)

ENGINE_ID_SUFFIX = ":prefill"
NOTHING_SENT = KVTransferResult(0, 0.0)


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


def kv_send_params(request: pb.PrefillRequest) -> KVSendParams | None:
    """Where the prompt's KV goes (None: prompt-only)."""
    if is_prompt_only(request):
        return None
    return KVSendParams(request.decode_ucx_address, request.request_id, tuple(request.dst_block_ids),
                        request.num_skip_blocks, request.transfer_token)


def prefill_response(request: pb.PrefillRequest, output: RequestOutput, sent: KVTransferResult,
                     with_prompt_logprobs: bool = True) -> pb.PrefillResponse:
    completion = output.outputs[0]
    first_token_id = completion.token_ids[0]
    response = pb.PrefillResponse(
        first_token_id=first_token_id, num_cached_prompt_tokens=output.num_cached_tokens,
        num_computed_prompt_tokens=len(request.prompt_token_ids) - output.num_cached_tokens,
        kv_bytes_sent=sent.num_bytes, kv_transfer_seconds=sent.seconds)
    if completion.logprobs:
        response.first_logprobs.CopyFrom(logprobs_to_proto(first_token_id, completion.logprobs[0]))
    if output.prompt_logprobs and with_prompt_logprobs:
        prompt = output.prompt_token_ids
        response.prompt_logprobs.extend(logprobs_to_proto(prompt[i + 1], entry)
                                        for i, entry in enumerate(output.prompt_logprobs))
    return response


class PrefillHandler(RoleHandler):
    def __init__(self, runtime):
        self.engine = runtime.engine
        self.adapters = runtime.adapters
        self.peers = PeerPuller(runtime)  # peer reuse: pulls a prefix another instance holds

    async def stop(self) -> None:
        await self.peers.close()

    async def prefill(self, request: pb.PrefillRequest) -> pb.PrefillResponse:
        response = None
        async with contextlib.aclosing(self.stream_prefill(request, with_first_token=False)) as events:
            async for event in events:
                response = event.done
        return response

    async def stream_prefill(self, request: pb.PrefillRequest,
                             with_first_token: bool = True) -> AsyncIterator[pb.PrefillEvent]:
        """The first token as soon as it is sampled (unless it only comes with the final output:
        nothing to send), then the outcome."""
        check_transfer_request(request, self.engine.info.cache.block_size)
        lora_request = self.adapters.resolve(request)
        if lora_request is not None:
            request.ClearField("peer_source")  # peers hold base-model prefixes only
        with span("prefill.peer_pull") as pull_span:
            num_pulled = await self.peers.pull(request)
            pull_span.set_attribute("pdserve.num_pulled_tokens", num_pulled)
        params = sampling_from_proto(request.sampling)
        num_resumed = request.num_resumed_output_tokens
        generate = GenerateRequest(
            f"{request.request_id}{ENGINE_ID_SUFFIX}", tuple(request.prompt_token_ids),
            prefill_params(params, num_resumed),
            request.cache_salt if request.HasField("cache_salt") else None, num_resumed, kv_send_params(request),
            lora_request)
        text, first_sent, output = FirstTokenText(params), False, None
        started, first_token_s = time.perf_counter(), None
        with span("prefill.engine", {"pdserve.request_id": request.request_id,
                                     "pdserve.num_prompt_tokens": len(request.prompt_token_ids)}) as engine_span:
            try:
                async with contextlib.aclosing(self.engine.generate(generate)) as outputs:
                    async for output in outputs:
                        if not first_sent and not output.finished and output.outputs[0].token_ids:
                            first_sent, first_token_s = True, time.perf_counter() - started
                            engine_span.add_event("first_token")
                            message = first_token_message(output, text.first(output.outputs[0].delta_text))
                            if with_first_token:
                                yield pb.PrefillEvent(first_token=message)
            except KVTransferFailedError as error:
                record_failure(engine_span, "ABORTED", f"KV transfer failed: {error}",
                               **{"pdserve.failure": "kv_transfer"})
                raise ServiceError(grpc.StatusCode.ABORTED, f"KV transfer of {request.request_id!r} to "
                                                            f"{request.decode_ucx_address} failed: {error}") from error
            if output is not None:
                engine_span.set_attributes(_send_attributes(request, output))
        check_not_aborted(request, output)
        self.peers.record_prompt(len(request.prompt_token_ids) - output.num_cached_tokens,
                                 first_token_s or time.perf_counter() - started)
        yield pb.PrefillEvent(done=self._outcome(request, output, params, text, first_sent and with_first_token,
                                                 num_pulled))

    def _outcome(self, request: pb.PrefillRequest, output: RequestOutput, params: SamplingParams,
                 text: FirstTokenText, is_first_token_sent: bool, num_pulled: int) -> pb.PrefillResponse:
        sent = output.kv_transfer or NOTHING_SENT
        logger.info("prefill %s: %d prompt tokens (%d cached, %d pulled), %d KV bytes to %s in %.1f ms",
                    request.request_id, len(request.prompt_token_ids), output.num_cached_tokens, num_pulled,
                    sent.num_bytes, request.decode_ucx_address, sent.seconds * 1e3)
        response = prefill_response(request, output, sent, with_prompt_logprobs=not is_first_token_sent)
        if num_pulled:
            response.num_peer_prompt_tokens = num_pulled
        if is_first_token_sent:
            end = ending(output, params, request.num_resumed_output_tokens, self.engine.info.max_model_len, text)
            if end is not None:
                add_ending(response, end)
        return response


def _send_attributes(request: pb.PrefillRequest, output: RequestOutput) -> dict[str, object]:
    """The prompt's outcome on the prefill side: cached tokens, and the KV send's bytes,
    blocks, duration and outcome."""
    sent = output.kv_transfer or NOTHING_SENT
    outcome = "none" if is_prompt_only(request) else "failed" if output.kv_transfer_error else "sent"
    return {"pdserve.num_cached_prompt_tokens": output.num_cached_tokens,
            "pdserve.kv_send.outcome": outcome, "pdserve.kv_send.bytes": sent.num_bytes,
            "pdserve.kv_send.blocks": max(0, len(request.dst_block_ids) - request.num_skip_blocks),
            "pdserve.kv_send.seconds": sent.seconds}


def check_not_aborted(request: pb.PrefillRequest, output: RequestOutput | None) -> None:
    if output is None or output.outputs[0].finish_reason == FinishReason.ABORT or not output.outputs[0].token_ids:
        raise ServiceError(grpc.StatusCode.ABORTED, f"prefill of {request.request_id!r} was aborted")
