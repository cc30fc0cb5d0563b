"""Small synchronous client helpers for the end-to-end tests of the gateway and instances."""

import random
from dataclasses import dataclass, field

import grpc

from shared.pb.pdserve.v1 import gateway_pb2, generation_pb2, instance_pb2

FINISHED = (generation_pb2.FINISH_REASON_STOP, generation_pb2.FINISH_REASON_LENGTH)


@dataclass
class Completion:
    """A whole streamed answer of one Generate call (n == 1)."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: int = generation_pb2.FINISH_REASON_UNSPECIFIED
    usage: generation_pb2.Usage | None = None
    num_messages: int = 0
    request_id: str = ""


def sampling(**fields) -> generation_pb2.SamplingParams:
    """SamplingParams; greedy (temperature 0) unless told otherwise."""
    fields.setdefault("temperature", 0.0)
    return generation_pb2.SamplingParams(**fields)


def generate_request(text: str | None = None, token_ids: list[int] | None = None,
                     chat: list[dict] | None = None, model: str = "", request_id: str = "",
                     **sampling_fields) -> gateway_pb2.GenerateRequest:
    request = gateway_pb2.GenerateRequest(model=model, request_id=request_id,
                                          sampling=sampling(**sampling_fields))
    if text is not None:
        request.text = text
    elif token_ids is not None:
        request.token_ids.ids.extend(token_ids)
    elif chat is not None:
        request.chat.messages.extend(gateway_pb2.ChatMessage(**message) for message in chat)
    return request


def collect(responses) -> Completion:
    """Drain a Generate stream into one Completion."""
    completion = Completion()
    for message in responses:
        completion.num_messages += 1
        completion.request_id = message.request_id
        completion.token_ids.extend(message.token_ids)
        completion.text += message.text
        if message.finish_reason:
            completion.finish_reason = message.finish_reason
        if message.HasField("usage"):
            completion.usage = message.usage
    return completion


def generate(stub, request: gateway_pb2.GenerateRequest, timeout_s: float = 120.0) -> Completion:
    return collect(stub.Generate(request, timeout=timeout_s))


def generate_error(stub, request: gateway_pb2.GenerateRequest, timeout_s: float = 60.0) -> grpc.RpcError:
    """The error a Generate call ends with (fails the test if it succeeds)."""
    try:
        completion = generate(stub, request, timeout_s)
    except grpc.RpcError as error:
        return error
    raise AssertionError(f"expected an error, got a completion: {completion}")


def random_token_ids(num_tokens: int, seed: int, low: int = 1000, high: int = 40000) -> list[int]:
    """Ordinary (non-special) token ids, reproducible per seed; distinct prompts per seed."""
    rng = random.Random(seed)
    return [rng.randrange(low, high) for _ in range(num_tokens)]


def reserve(stub, request_id: str, token_ids: list[int], lease_ms: int,
            max_tokens: int = 1) -> instance_pb2.ReserveResponse:
    return stub.Reserve(instance_pb2.ReserveRequest(
        request_id=request_id, prompt_token_ids=token_ids,
        sampling=sampling(max_tokens=max_tokens), lease_ms=lease_ms), timeout=30)


def release(stub, request_id: str) -> bool:
    return stub.Release(instance_pb2.ReleaseRequest(request_id=request_id), timeout=30).released
