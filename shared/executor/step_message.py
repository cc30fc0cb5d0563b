"""The compact per-step message the engine broadcasts to its workers, and both ends of it.

A request the workers have not seen goes out in full once (`NewRequest`: its tokens, block
table and sampling parameters); afterwards only what changed (`RequestDelta`: output tokens
and blocks appended since) plus the step's rows (`Row`: which positions to compute). Workers
keep a mirror of every live request (`WorkerRequests`) and rebuild the `SchedulerOutput`
from it; the engine's `StepEncoder` keeps a mirror of what the workers know. Finished and
preempted requests are dropped on both sides; a request whose block table changed other than by
appending is simply sent in full again. Encoded with msgspec's typed MessagePack: only these
types decode, nothing else.
"""

from dataclasses import dataclass, replace

import msgspec
import torch

from shared.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared.lora.request import LoRARequest
from shared.sampling.params import SamplingParams


class AdapterRef(msgspec.Struct, array_like=True):
    """A request's LoRA adapter (LoRARequest on the wire): each worker reads its shard of the folder."""
    lora_name: str
    lora_int_id: int
    lora_path: str

    @classmethod
    def of(cls, request: LoRARequest | None) -> "AdapterRef | None":
        return None if request is None else cls(request.lora_name, request.lora_int_id, request.lora_path)

    def to_request(self) -> LoRARequest:
        return LoRARequest(self.lora_name, self.lora_int_id, self.lora_path)


class NewRequest(msgspec.Struct, array_like=True):
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    block_ids: list[int]
    # The scheduler hands a request's parameters over with its first sampling row only.
    sampling_params: SamplingParams | None
    lora_request: AdapterRef | None = None


class RequestDelta(msgspec.Struct, array_like=True, omit_defaults=True):
    request_id: str
    new_output_token_ids: list[int]
    new_block_ids: list[int]
    sampling_params: SamplingParams | None = None


class Row(msgspec.Struct, array_like=True, omit_defaults=True):
    request_id: str
    start_position: int
    num_tokens: int
    samples: bool
    stop_and_eos_token_ids: list[int] = []
    prompt_logprob_targets: list[int] | None = None
    num_prompt_logprobs: int = 0
    # int32 words of the guided-decoding token bitmask.
    guided_bitmask: bytes | None = None


class StepMessage(msgspec.Struct, array_like=True, omit_defaults=True):
    new_requests: list[NewRequest] = []
    deltas: list[RequestDelta] = []
    rows: list[Row] = []
    finished_request_ids: list[str] = []
    preempted_request_ids: list[str] = []
    shutdown: bool = False


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StepMessage)


def encode_step(message: StepMessage) -> bytes:
    return _encoder.encode(message)


def decode_step(payload: bytes) -> StepMessage:
    return _decoder.decode(payload)


@dataclass
class _Known:
    num_output_tokens: int
    block_ids: list[int]
    has_sampling_params: bool


class StepEncoder:
    """Engine side: turns each SchedulerOutput into the smallest message the workers need."""

    def __init__(self):
        self._known: dict[str, _Known] = {}

    def encode(self, scheduler_output: SchedulerOutput) -> StepMessage:
        gone = [*scheduler_output.finished_request_ids, *scheduler_output.preempted_request_ids]
        for request_id in gone:
            self._known.pop(request_id, None)
        message = StepMessage(finished_request_ids=sorted(scheduler_output.finished_request_ids),
                              preempted_request_ids=list(scheduler_output.preempted_request_ids))
        for item in scheduler_output.scheduled:
            self._add_request_state(message, item)
            message.rows.append(_row(item))
        return message

    def _add_request_state(self, message: StepMessage, item: ScheduledRequest) -> None:
        known = self._known.get(item.request_id)
        params = replace(item.sampling_params, guided=None) if item.sampling_params else None
        if known is None or not _extends(known, item):
            message.new_requests.append(NewRequest(
                item.request_id, list(item.prompt_token_ids), list(item.output_token_ids),
                list(item.block_ids), params, AdapterRef.of(item.lora_request)))
        else:
            new_outputs = item.output_token_ids[known.num_output_tokens:]
            new_blocks = item.block_ids[len(known.block_ids):]
            new_params = params if not known.has_sampling_params else None
            if new_outputs or new_blocks or new_params:
                message.deltas.append(RequestDelta(item.request_id, list(new_outputs), list(new_blocks),
                                                   new_params))
        has_params = params is not None or (known is not None and known.has_sampling_params
                                            and _extends(known, item))
        self._known[item.request_id] = _Known(len(item.output_token_ids), list(item.block_ids), has_params)


def _extends(known: _Known, item: ScheduledRequest) -> bool:
    """True when the request only grew since the workers last saw it."""
    return (known.num_output_tokens <= len(item.output_token_ids)
            and item.block_ids[:len(known.block_ids)] == known.block_ids)


def _row(item: ScheduledRequest) -> Row:
    bitmask = item.guided_bitmask
    return Row(item.request_id, item.start_position, item.num_tokens, item.sampling_params is not None,
               list(item.stop_and_eos_token_ids), item.prompt_logprob_targets, item.num_prompt_logprobs,
               None if bitmask is None else bitmask.to(torch.int32).contiguous().numpy().tobytes())


@dataclass
class _WorkerRequest:
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    block_ids: list[int]
    sampling_params: SamplingParams | None
    lora_request: LoRARequest | None = None


class WorkerRequests:
    """Worker side: the live requests' state, updated by each message."""

    def __init__(self):
        self._requests: dict[str, _WorkerRequest] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def apply(self, message: StepMessage) -> SchedulerOutput:
        for request_id in [*message.finished_request_ids, *message.preempted_request_ids]:
            self._requests.pop(request_id, None)
        for new in message.new_requests:
            self._requests[new.request_id] = _WorkerRequest(
                new.prompt_token_ids, new.output_token_ids, new.block_ids, new.sampling_params,
                new.lora_request.to_request() if new.lora_request is not None else None)
        for delta in message.deltas:
            request = self._requests[delta.request_id]
            request.output_token_ids.extend(delta.new_output_token_ids)
            request.block_ids.extend(delta.new_block_ids)
            if delta.sampling_params is not None:
                request.sampling_params = delta.sampling_params
        return SchedulerOutput(scheduled=[self._scheduled(row) for row in message.rows],
                               finished_request_ids=set(message.finished_request_ids),
                               preempted_request_ids=list(message.preempted_request_ids))

    def _scheduled(self, row: Row) -> ScheduledRequest:
        request = self._requests[row.request_id]
        end = row.start_position + row.num_tokens
        num_prompt = len(request.prompt_token_ids)
        token_ids = (request.prompt_token_ids[row.start_position:end]
                     + request.output_token_ids[max(0, row.start_position - num_prompt):max(0, end - num_prompt)])
        bitmask = None if row.guided_bitmask is None else torch.frombuffer(
            bytearray(row.guided_bitmask), dtype=torch.int32)
        return ScheduledRequest(
            request_id=row.request_id, token_ids=token_ids, start_position=row.start_position,
            block_ids=list(request.block_ids), sampling_params=request.sampling_params if row.samples else None,
            prompt_token_ids=request.prompt_token_ids, output_token_ids=list(request.output_token_ids),
            stop_and_eos_token_ids=tuple(row.stop_and_eos_token_ids),
            prompt_logprob_targets=row.prompt_logprob_targets, num_prompt_logprobs=row.num_prompt_logprobs,
            guided_bitmask=bitmask, lora_request=request.lora_request)
