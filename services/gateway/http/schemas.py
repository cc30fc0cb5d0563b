"""Request bodies of the OpenAI-compatible endpoints (pydantic, as FastAPI parses them).

Only types are checked here (a wrong type is a 400 naming the field); ranges and meaning
are checked by the same validation as the gRPC API, once the body is converted to a
GenerateRequest (`to_internal`). Unknown top-level fields are accepted, as OpenAI-compatible
servers do, and kept in `model_extra` so that the endpoints log and count them
(services.gateway.unknown_fields); fields we know but cannot honour are declared so that
`to_internal` can refuse them.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: one of json, regex, choice, grammar, json_object
    (`guided_fields` checks that exactly one is set)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    json_schema: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # Known but not supported: refused when set.
    whitespace_pattern: str | None = None
    structural_tag: Any = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: running usage in every chunk


class SamplingFields(BaseModel):
    """Fields both endpoints share: OpenAI's and the extras vLLM users send."""

    model_config = ConfigDict(extra="allow")

    model: str = ""  # empty: the served model
    user: str | None = None  # OpenAI's end-user id: accepted, not used
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    # pdserve: false keeps this request out of speculative decoding.
    use_speculation: bool | None = None
    # vLLM's: logprobs of every prompt token after the first, with this many alternatives.
    prompt_logprobs: int | None = None
    # vLLM's tenant isolation: requests with different salts never share prefix-cache blocks.
    cache_salt: str | None = None
    # Guided decoding (`guided_fields`): OpenAI's response_format, or vLLM's extras.
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_whitespace_pattern: str | None = None  # refused when set
    # Known but not supported: refused when set.
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None


class CompletionRequest(SamplingFields):
    """`POST /v1/completions`."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions; null: up to the model's length
    logprobs: int | None = None  # top alternatives per token (0: the sampled token only)
    echo: bool | None = None  # the prompt starts each choice's text (and logprobs)
    suffix: str | None = None  # not supported


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    """A call in an assistant message of the conversation."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages
    name: str | None = None


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: any object
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str = "function"
    function: FunctionDefinition


class ChatCompletionRequest(SamplingFields):
    """`POST /v1/chat/completions` (the model's chat template is applied)."""

    messages: list[ChatMessage]
    max_tokens: int | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    # "none", "auto", "required" or {"type": "function", "function": {"name": ...}}
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # false: at most one call with "required"


class LoRAAdapterBody(BaseModel):
    """`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM's bodies)."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str | None = None
