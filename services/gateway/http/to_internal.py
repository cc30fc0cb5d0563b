"""OpenAI request bodies -> the gateway's own GenerateRequest messages (one per prompt).

The HTTP endpoints call `completion_to_internal` / `chat_to_internal`; the messages then go
through exactly the validation, tokenization and routing of the gRPC API. Problems found
here raise InvalidRequestError naming the OpenAI field. `renamed` maps the field names the
shared validation uses to the OpenAI names, so its errors name what the client sent.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from shared.errors import InvalidRequestError
from shared.pb.pdserve.v1 import gateway_pb2, generation_pb2
from shared.wire.guided import guided_to_proto

from services.gateway.http.guided_fields import guided_from_body
from services.gateway.http.tool_choice import ToolOptions, ToolPlan, plan_tools
from services.gateway.http.tool_prompt import with_tool_turns
from services.gateway.http.schemas import (
    ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields)

MAX_PROMPTS = 64  # prompts in one /v1/completions request (the default of --max-prompts)
# Copied to SamplingParams under the same name when set.
_SAME_NAME_FIELDS = (
    "n", "seed", "temperature", "top_p", "presence_penalty", "frequency_penalty", "top_k", "min_p",
    "min_tokens", "ignore_eos", "repetition_penalty", "skip_special_tokens", "include_stop_str_in_output",
    "use_speculation", "prompt_logprobs",
)
_COMPLETION_RENAMES = {"text": "prompt", "token_ids": "prompt"}
_CHAT_RENAMES = {"chat.messages": "messages", "chat": "messages", "prompt": "messages"}


@dataclass(frozen=True)
class InternalRequest:
    """What one OpenAI request becomes: a GenerateRequest per prompt, n completions each."""

    messages: list[gateway_pb2.GenerateRequest]
    n: int
    stream: bool
    include_usage: bool
    renamed: dict[str, str] = field(default_factory=dict)  # internal field -> OpenAI field
    continuous_usage: bool = False  # running usage in every streamed chunk
    is_echo_only: bool = False  # echo with max_tokens 0: the engine's one token is dropped
    tools: ToolPlan = ToolPlan("none", [])  # chat: what tool calling asks for


def completion_to_internal(body: CompletionRequest, request_id: str,
                           max_prompts: int = MAX_PROMPTS) -> InternalRequest:
    _refuse_unsupported(body)
    if body.suffix:
        raise InvalidRequestError("suffix", "is not supported by this server")
    is_echo_only = bool(body.echo) and body.max_tokens == 0
    sampling = sampling_proto(body, 1 if is_echo_only else body.max_tokens, body.logprobs)
    renamed = dict(_COMPLETION_RENAMES, **add_guided(sampling, body))
    if body.echo and body.logprobs is not None:  # the echoed prompt's logprobs come from the engine
        _set_scalar(sampling, "prompt_logprobs", max(body.logprobs, body.prompt_logprobs or 0))
        if body.prompt_logprobs is None:
            renamed["prompt_logprobs"] = "logprobs"
    prompts = split_prompts(body.prompt, max_prompts)
    messages = []
    for index, prompt in enumerate(prompts):
        message_id = request_id if len(prompts) == 1 else f"{request_id}-{index}"
        message = gateway_pb2.GenerateRequest(request_id=message_id, model=body.model, sampling=sampling)
        if isinstance(prompt, str):
            message.text = prompt
        else:
            message.token_ids.ids.extend(_checked_token_ids(prompt))
        messages.append(message)
    return _internal(body, messages, renamed, is_echo_only=is_echo_only)


def chat_to_internal(body: ChatCompletionRequest, request_id: str,
                     tool_options: ToolOptions = ToolOptions()) -> InternalRequest:
    _refuse_unsupported(body)
    tools = plan_tools(body, tool_options)
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequestError("top_logprobs", "requires logprobs to be true")
    renamed = dict(_CHAT_RENAMES, logprobs="top_logprobs")
    max_tokens = body.max_tokens
    if body.max_completion_tokens is not None:
        max_tokens = body.max_completion_tokens
        renamed["max_tokens"] = "max_completion_tokens"
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    sampling = sampling_proto(body, max_tokens, logprobs)
    renamed.update(add_guided(sampling, body))
    _add_tool_guide(sampling, tools, renamed)
    rendered = with_tool_turns([_chat_message(m, i) for i, m in enumerate(body.messages)], body.messages,
                               tools.tools)
    message = gateway_pb2.GenerateRequest(request_id=request_id, model=body.model, sampling=sampling,
                                          chat=gateway_pb2.ChatMessages(messages=rendered))
    return replace(_internal(body, [message], renamed), tools=tools)


def _add_tool_guide(message: generation_pb2.SamplingParams, tools: ToolPlan, renamed: dict[str, str]) -> None:
    """A named function or "required": the output constrained to the call(s)."""
    guided = tools.guided
    if guided is None:
        return
    if message.HasField("guided"):
        raise InvalidRequestError("tool_choice", f"{tools.mode!r} cannot be combined with another "
                                                 "guided-decoding constraint")
    message.guided.CopyFrom(guided_to_proto(guided))
    renamed.update({"guided": "tool_choice", "guided.json_schema": "tools"})


def _internal(body: SamplingFields, messages: list[gateway_pb2.GenerateRequest],
              renamed: dict[str, str], is_echo_only: bool = False) -> InternalRequest:
    options = body.stream_options
    include_usage = bool(options and options.include_usage)
    if body.cache_salt is not None:
        for message in messages:
            message.cache_salt = body.cache_salt
    return InternalRequest(messages, n=body.n or 1, stream=bool(body.stream), include_usage=include_usage,
                           renamed=renamed, continuous_usage=include_usage and options.continuous_usage_stats,
                           is_echo_only=is_echo_only)


def _refuse_unsupported(body: SamplingFields) -> None:
    if body.logit_bias:
        raise InvalidRequestError("logit_bias", "is not supported by this server")
    if body.best_of is not None and body.best_of != (body.n or 1):
        raise InvalidRequestError("best_of", f"only best_of == n is supported, got {body.best_of}")


def sampling_proto(body: SamplingFields, max_tokens: int | None,
                   logprobs: int | None) -> generation_pb2.SamplingParams:
    """Only what the client set; the rest keeps the engine's (vLLM's) defaults."""
    message = generation_pb2.SamplingParams()
    values = {name: getattr(body, name) for name in _SAME_NAME_FIELDS}
    values.update(max_tokens=max_tokens, logprobs=logprobs)
    for name, value in values.items():
        if value is not None:
            _set_scalar(message, name, value)
    if body.stop is not None:
        message.stop.extend([body.stop] if isinstance(body.stop, str) else body.stop)
    try:
        message.stop_token_ids.extend(body.stop_token_ids or [])
    except ValueError as error:
        raise InvalidRequestError("stop_token_ids", f"out of range: {error}") from error
    return message


def add_guided(message: generation_pb2.SamplingParams, body: SamplingFields) -> dict[str, str]:
    """Set `message.guided` from the body's guided-decoding fields; returns the renames that make
    the engine's errors about it name the OpenAI field."""
    guided, renamed = guided_from_body(body)
    if guided is not None:
        message.guided.CopyFrom(guided_to_proto(guided))
    return renamed


def _set_scalar(message: generation_pb2.SamplingParams, name: str, value: object) -> None:
    try:
        setattr(message, name, value)
    except (TypeError, ValueError) as error:
        raise InvalidRequestError(name, f"out of range: {value!r}") from error


def split_prompts(prompt: str | list, max_prompts: int = MAX_PROMPTS) -> list[str | list[int]]:
    """One prompt (text or token ids) or a batch of them (at most `max_prompts`)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise InvalidRequestError("prompt", "must not be empty")
    prompts = [prompt] if isinstance(prompt[0], int) else list(prompt)
    if len(prompts) > max_prompts:
        raise InvalidRequestError("prompt", f"at most {max_prompts} prompts per request, got {len(prompts)}")
    return prompts


def _checked_token_ids(token_ids: Sequence[int]) -> list[int]:
    bad = [t for t in token_ids if t < 0 or t >= 2**32]
    if bad:
        raise InvalidRequestError("prompt", f"token id {bad[0]} is outside the vocabulary")
    return list(token_ids)


def _chat_message(message: ChatMessage, index: int) -> gateway_pb2.ChatMessage:
    """OpenAI's `developer` role is the template's `system`; text parts are joined."""
    role = "system" if message.role == "developer" else message.role
    if message.content is None or isinstance(message.content, str):
        return gateway_pb2.ChatMessage(role=role, content=message.content or "")
    texts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise InvalidRequestError("messages", f"item {index}: content parts of type "
                                                  f"{part.type!r} are not supported (only text)")
        texts.append(part.text)
    return gateway_pb2.ChatMessage(role=role, content="\n".join(texts))
