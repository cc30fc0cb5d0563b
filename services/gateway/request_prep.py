"""Turn a GenerateRequest into a PreparedRequest: validated and tokenized, its block hashes
computed on demand with each instance's registered recipe (services.gateway.prompt_hashes).

Every rejection is a GatewayError: INVALID_ARGUMENT with a message that starts with the bad
field's name, or NOT_FOUND for a model this gateway does not serve.
"""

import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass, replace

from shared.errors import InvalidRequestError
from shared.pb.pdserve.v1 import gateway_pb2, generation_pb2, instance_pb2
from shared.sampling.params import SamplingParams
from shared.tokenization import apply_chat_template, encode_prompt
from shared.wire.sampling import sampling_from_proto, sampling_to_proto

from services.gateway.errors import invalid_argument, model_not_found
from services.gateway.limits import (
    RequestLimits, check_chat, check_generate_request, check_model_name, check_prompt_tokens)
from services.gateway.prompt_hashes import PromptHashes
from services.gateway.served_model import ServedModel

# '#' is left out: fan-out sub-requests are named `<id>#<index>`.
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:/@\-]{1,128}")
MAX_CACHE_SALT_CHARS = 256


@dataclass(frozen=True)
class PreparedRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None
    hashes: PromptHashes
    # Only the prompt matters (its logprobs, its usage): the generated token is dropped, and the
    # disaggregated route skips decode (services.gateway.prompt_only).
    is_prompt_only: bool = False

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter the request's `model` names (None: the base model)."""
        return self.hashes.adapter

    def adapter_ref(self) -> instance_pb2.LoRAAdapterRef | None:
        """The adapter as the instances get it: its name and the key of the instances chosen."""
        if self.hashes.adapter is None:
            return None
        return instance_pb2.LoRAAdapterRef(name=self.hashes.adapter, key=self.hashes.adapter_key or "")

    @property
    def n(self) -> int:
        return self.params.n

    def sampling_proto(self) -> generation_pb2.SamplingParams:
        return sampling_to_proto(self.params)


@dataclass(frozen=True)
class SubRequest:
    """One completion of a request, sent through the instances on its own (n == 1)."""

    request_id: str
    index: int
    parent: PreparedRequest
    params: SamplingParams
    # Migration: tokens the client already has; the instances continue after them.
    resumed_token_ids: tuple[int, ...] = ()

    @property
    def prompt_token_ids(self) -> list[int]:
        """What the instances compute: the prompt, then any resumed outputs."""
        return [*self.parent.prompt_token_ids, *self.resumed_token_ids]

    def sampling_proto(self) -> generation_pb2.SamplingParams:
        return sampling_to_proto(self.params)


def prepare_request(message: gateway_pb2.GenerateRequest, model: ServedModel,
                    limits: RequestLimits = RequestLimits(), adapters: Collection[str] = ()) -> PreparedRequest:
    """Raises GatewayError (INVALID_ARGUMENT naming the field, or NOT_FOUND). `adapters`: the
    LoRA adapters the `model` field may name besides the base model."""
    adapter = check_model(message.model, model, limits, adapters)
    try:
        check_generate_request(message, limits)
        return _prepare(message, model, limits, adapter)
    except InvalidRequestError as error:
        raise invalid_argument(error) from error


def check_model(requested: str, model: ServedModel, limits: RequestLimits = RequestLimits(),
                adapters: Collection[str] = ()) -> str | None:
    """The LoRA adapter `requested` names (None: the base model); NOT_FOUND naming it when it
    is neither."""
    try:
        check_model_name(requested, limits)
    except InvalidRequestError as error:
        raise invalid_argument(error) from error
    if model.accepts(requested):
        return None
    if requested in adapters:
        return requested
    raise model_not_found(requested, model.name, sorted(adapters))


def _prepare(message: gateway_pb2.GenerateRequest, model: ServedModel, limits: RequestLimits,
             adapter: str | None = None) -> PreparedRequest:
    request_id = validate_request_id(message.request_id)
    params = sampling_from_proto(message.sampling)
    params.validate(model.vocab_size)
    token_ids = prompt_token_ids(message, model)
    check_prompt_tokens(message.WhichOneof("prompt"), len(token_ids), limits)
    salt = validate_cache_salt(message.cache_salt if message.HasField("cache_salt") else None)
    return PreparedRequest(request_id, token_ids, params, salt, PromptHashes(token_ids, salt, adapter))


def validate_request_id(request_id: str) -> str:
    """The client's id, or a fresh one when empty."""
    if not request_id:
        return f"req-{uuid.uuid4().hex}"
    if not REQUEST_ID_PATTERN.fullmatch(request_id):
        raise InvalidRequestError(
            "request_id", f"must be 1-128 characters of [A-Za-z0-9._:/@-], got {request_id[:140]!r}")
    return request_id


def validate_cache_salt(salt: str | None) -> str | None:
    if salt is not None and len(salt) > MAX_CACHE_SALT_CHARS:
        raise InvalidRequestError("cache_salt", f"must be at most {MAX_CACHE_SALT_CHARS} characters")
    return salt or None


def prompt_token_ids(message, model: ServedModel) -> list[int]:
    """Token ids of the request's text, token ids or chat prompt, checked against the model."""
    kind = message.WhichOneof("prompt")
    if kind is None:
        raise InvalidRequestError("prompt", "must be set: text, token_ids or chat")
    if kind == "text":
        if not message.text:
            raise InvalidRequestError("text", "must not be empty")
        token_ids = encode_prompt(model.tokenizer, message.text)
    elif kind == "token_ids":
        token_ids = list(message.token_ids.ids)
        bad = [t for t in token_ids if t >= model.vocab_size]
        if bad:
            raise InvalidRequestError(
                "token_ids", f"token id {bad[0]} is outside the vocabulary [0, {model.vocab_size})")
    else:
        token_ids = chat_token_ids(message.chat, model)
    check_prompt_length(kind, token_ids, model.max_model_len)
    return token_ids


def chat_token_ids(chat: gateway_pb2.ChatMessages, model: ServedModel) -> list[int]:
    messages = [{"role": m.role, "content": m.content} for m in chat.messages]
    try:
        return apply_chat_template(model.tokenizer, messages)
    except InvalidRequestError as error:
        raise InvalidRequestError("chat.messages", error.message) from error


def check_prompt_length(kind: str, token_ids: list[int], max_model_len: int) -> None:
    if not token_ids:
        raise InvalidRequestError(kind, "must not be empty (it has no tokens)")
    if len(token_ids) >= max_model_len:
        raise InvalidRequestError(
            kind, f"{len(token_ids)} tokens leave no room to generate: the model's limit is {max_model_len}")


def split_request(request: PreparedRequest) -> list[SubRequest]:
    """n == 1: the request itself. n > 1: `<id>#<i>`, seeds seed+i for i > 0 (as the engine)."""
    if request.n == 1:
        return [SubRequest(request.request_id, 0, request, request.params)]
    subs = []
    for index in range(request.n):
        seed = request.params.seed
        if seed is not None and index > 0:
            seed += index
        params = replace(request.params, n=1, best_of=None, seed=seed)
        subs.append(SubRequest(f"{request.request_id}#{index}", index, request, params))
    return subs


def tokenize_request(message: gateway_pb2.TokenizeRequest, model: ServedModel,
                     limits: RequestLimits = RequestLimits(), adapters: Collection[str] = ()) -> list[int]:
    """Token ids for the Tokenize RPC (the prompt byte limits apply, not the model's length);
    a LoRA adapter's name tokenizes as its base model."""
    check_model(message.model, model, limits, adapters)
    try:
        kind = message.WhichOneof("prompt")
        if kind == "text":
            if len(message.text.encode()) > limits.max_prompt_bytes:
                raise InvalidRequestError("text", f"is over the limit of {limits.max_prompt_bytes} bytes")
            return encode_prompt(model.tokenizer, message.text)
        if kind == "chat":
            check_chat(message.chat, limits)
            return chat_token_ids(message.chat, model)
        raise InvalidRequestError("prompt", "must be set: text or chat")
    except InvalidRequestError as error:
        raise invalid_argument(error) from error
