"""What a chat request's `tools` and `tool_choice` ask for, checked, as a ToolPlan.

As vLLM: `"none"` accepts and ignores the tools; with tools and no tool_choice, `"auto"`.
A named function (`{"type": "function", "function": {"name": ...}}`) and `"required"` are
enforced with guided decoding (XGrammar, on whichever instances run the request): the named
function's output is its arguments, constrained by its `parameters` schema; `"required"`
outputs a JSON array of one or more `{"name": ..., "parameters": {...}}`, each item one of
the tools with its own schema (at most one item with `parallel_tool_calls: false`).
`"auto"` lets the model choose, and needs the gateway's `--enable-auto-tool-choice` with a
`--tool-call-parser`: the parser finds the calls in the text.
"""

from dataclasses import dataclass

from shared.errors import InvalidRequestError
from shared.guided.params import GuidedDecodingParams

from services.gateway.http.schemas import ChatCompletionRequest, FunctionDefinition

TOOL_CHOICES = ("none", "auto", "required")
TOOL_CALL_PARSERS = ("hermes",)
ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class ToolOptions:
    """The gateway's settings for tool calling."""

    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # "none", "named", "required" or "auto"
    tools: list[FunctionDefinition]  # shown to the model (none with "none")
    named: str | None = None  # the named function's name
    max_calls: int | None = None  # "required" with parallel_tool_calls false: 1

    @property
    def guided(self) -> GuidedDecodingParams | None:
        if self.mode == "named":
            tool = next(tool for tool in self.tools if tool.name == self.named)
            return GuidedDecodingParams(json_schema=tool.parameters or ANY_OBJECT)
        if self.mode == "required":
            return GuidedDecodingParams(json_schema=required_schema(self.tools, self.max_calls))
        return None


def plan_tools(body: ChatCompletionRequest, options: ToolOptions) -> ToolPlan:
    """Raises InvalidRequestError naming `tools` or `tool_choice`."""
    tools = [tool.function for tool in body.tools or []]
    if any(tool.type != "function" for tool in body.tools or []):
        raise InvalidRequestError("tools", 'only tools of type "function" are supported')
    choice = body.tool_choice if body.tool_choice is not None else ("auto" if tools else "none")
    if choice == "none":
        return ToolPlan("none", [])
    if not tools:
        raise InvalidRequestError("tool_choice", f"{choice!r:.100} needs tools")
    if isinstance(choice, dict):
        return ToolPlan("named", tools, named=_named_function(choice, tools))
    if choice == "required":
        return ToolPlan("required", tools, max_calls=1 if body.parallel_tool_calls is False else None)
    if choice != "auto":
        raise InvalidRequestError("tool_choice", f"must be one of {', '.join(TOOL_CHOICES)} or a named "
                                                 f"function, got {choice!r:.100}")
    if not (options.enable_auto_tool_choice and options.tool_call_parser):
        raise InvalidRequestError("tool_choice", '"auto" needs the gateway started with '
                                                 "--enable-auto-tool-choice and --tool-call-parser")
    return ToolPlan("auto", tools)


def _named_function(choice: dict, tools: list[FunctionDefinition]) -> str:
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise InvalidRequestError("tool_choice", 'a named choice is {"type": "function", "function": '
                                                 '{"name": ...}}')
    if name not in {tool.name for tool in tools}:
        raise InvalidRequestError("tool_choice", f"names {name!r:.100}, which is not among the tools")
    return name


def required_schema(tools: list[FunctionDefinition], max_calls: int | None) -> dict:
    """A JSON array of calls, each `{"name": <one tool>, "parameters": <its arguments>}`."""
    calls = [{"type": "object", "required": ["name", "parameters"],
              "properties": {"name": {"type": "string", "enum": [tool.name]},
                             "parameters": tool.parameters or ANY_OBJECT}} for tool in tools]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if max_calls is not None:
        schema["maxItems"] = max_calls
    return schema
