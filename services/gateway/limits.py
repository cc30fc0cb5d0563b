"""Request limits, checked once at the gateway for both front doors.

Every limit is a gateway flag and a `PDSERVE_*` variable (`--max-prompt-bytes` is
`PDSERVE_MAX_PROMPT_BYTES`). `check_generate_request` runs on the GenerateRequest that both
the gRPC API and the HTTP API (after conversion) hand to `prepare_request`, before any
tokenization; a request over a limit is INVALID_ARGUMENT / 400 naming the field, its message
never echoing the oversized value. Whatever passes fits every internal hop:
`check_fits_internal_hops` proves at start-up that the largest message the gateway can build
for an instance stays under the instances' gRPC message limit.
"""

from pydantic import Field

from shared.errors import ConfigurationError, InvalidRequestError
from shared.pb.pdserve.v1 import gateway_pb2

from services.rpc.message_limits import MAX_INTERNAL_MESSAGE_BYTES
from services.settings.service_settings import ServiceSettings

MIB = 1024 * 1024
# Room for everything in an internal message besides the limited fields (ids, scalars, framing).
INTERNAL_OVERHEAD_BYTES = 64 * 1024
MAX_VARINT_BYTES = 10


def _limit(default: int, help_text: str, minimum: int = 1):
    return Field(default=default, description=help_text, ge=minimum)


class RequestLimits(ServiceSettings):
    """The limits; GatewaySettings inherits them as settings of its own."""

    max_request_bytes: int = _limit(32 * MIB, "largest HTTP body or gRPC request message, bytes")
    max_prompt_bytes: int = _limit(1 * MIB, "prompt text (or all chat messages) in UTF-8 bytes")
    max_prompt_tokens: int = _limit(0, "prompt tokens (0: the model's length minus one)", minimum=0)
    max_prompts: int = _limit(64, "prompts in one /v1/completions request")
    max_messages: int = _limit(1024, "chat messages in one request")
    max_n: int = _limit(32, "completions per prompt (n, best_of)")
    max_logprobs: int = _limit(20, "logprobs / top_logprobs / prompt_logprobs alternatives")
    max_stop_strings: int = _limit(32, "stop strings in one request")
    max_stop_chars: int = _limit(1024, "characters in one stop string")
    max_stop_token_ids: int = _limit(1024, "stop_token_ids in one request")
    max_guided_bytes: int = _limit(512 * 1024, "guided json schema, regex, grammar or choices, UTF-8 bytes")
    max_model_name_chars: int = _limit(256, "characters in the model name")

    @property
    def limits(self) -> "RequestLimits":
        """Just the limits (of a GatewaySettings, say)."""
        return RequestLimits(**{name: getattr(self, name) for name in RequestLimits.model_fields})


def check_generate_request(message: gateway_pb2.GenerateRequest, limits: RequestLimits) -> None:
    """Raises InvalidRequestError naming the first field over its limit."""
    check_model_name(message.model, limits)
    _check_prompt(message, limits)
    if message.HasField("sampling"):
        check_sampling(message.sampling, limits)


def check_model_name(name: str, limits: RequestLimits) -> None:
    if len(name) > limits.max_model_name_chars:
        raise InvalidRequestError("model", f"is {len(name)} characters long; the limit is "
                                           f"{limits.max_model_name_chars}")


def _check_prompt(message: gateway_pb2.GenerateRequest, limits: RequestLimits) -> None:
    kind = message.WhichOneof("prompt")
    if kind == "text":
        _check_bytes("text", utf8_size(message.text), limits.max_prompt_bytes)
    elif kind == "chat":
        check_chat(message.chat, limits)


def check_chat(chat: gateway_pb2.ChatMessages, limits: RequestLimits) -> None:
    if len(chat.messages) > limits.max_messages:
        raise InvalidRequestError("chat.messages", f"at most {limits.max_messages} messages, "
                                                   f"got {len(chat.messages)}")
    size = sum(utf8_size(m.role) + utf8_size(m.content) for m in chat.messages)
    _check_bytes("chat.messages", size, limits.max_prompt_bytes)


def check_prompt_tokens(kind: str, num_tokens: int, limits: RequestLimits) -> None:
    if limits.max_prompt_tokens and num_tokens > limits.max_prompt_tokens:
        raise InvalidRequestError(kind, f"{num_tokens} prompt tokens; the limit is {limits.max_prompt_tokens}")


def check_sampling(sampling, limits: RequestLimits) -> None:
    for name in ("n", "logprobs", "prompt_logprobs"):
        limit = limits.max_n if name == "n" else limits.max_logprobs
        if sampling.HasField(name) and getattr(sampling, name) > limit:
            raise InvalidRequestError(name, f"must be <= {limit}, got {getattr(sampling, name)}")
    _check_count("stop", len(sampling.stop), limits.max_stop_strings)
    for stop in sampling.stop:
        if len(stop) > limits.max_stop_chars:
            raise InvalidRequestError("stop", f"a stop string of {len(stop)} characters; the limit is "
                                              f"{limits.max_stop_chars}")
    _check_count("stop_token_ids", len(sampling.stop_token_ids), limits.max_stop_token_ids)
    if sampling.HasField("guided"):
        _check_guided(sampling.guided, limits)


def _check_guided(guided, limits: RequestLimits) -> None:
    kind = guided.WhichOneof("constraint")
    if kind in ("json_schema", "regex", "grammar"):
        _check_bytes(f"guided.{kind}", utf8_size(getattr(guided, kind)), limits.max_guided_bytes)
    elif kind == "choice":
        size = sum(utf8_size(choice) for choice in guided.choice.choices)
        _check_bytes("guided.choice", size, limits.max_guided_bytes)


def _check_count(name: str, count: int, limit: int) -> None:
    if count > limit:
        raise InvalidRequestError(name, f"at most {limit} entries, got {count}")


def _check_bytes(name: str, size: int, limit: int) -> None:
    if size > limit:
        raise InvalidRequestError(name, f"is {size} bytes (UTF-8); the limit is {limit}")


def utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def largest_internal_message_bytes(limits: RequestLimits, max_model_len: int) -> int:
    """An upper bound on any message the gateway sends an instance for an accepted request."""
    prompt_tokens = limits.max_prompt_tokens or max_model_len
    return (INTERNAL_OVERHEAD_BYTES + prompt_tokens * MAX_VARINT_BYTES + limits.max_guided_bytes * 2
            + limits.max_stop_strings * (limits.max_stop_chars * 4 + MAX_VARINT_BYTES)
            + limits.max_stop_token_ids * MAX_VARINT_BYTES)


def check_fits_internal_hops(limits: RequestLimits, max_model_len: int) -> None:
    """Raises ConfigurationError when an accepted request could exceed an instance's limit."""
    size = largest_internal_message_bytes(limits, max_model_len)
    if size > MAX_INTERNAL_MESSAGE_BYTES:
        raise ConfigurationError("max_guided_bytes", f"these limits allow internal messages of {size} bytes, "
                                                     f"over the instances' {MAX_INTERNAL_MESSAGE_BYTES}")
