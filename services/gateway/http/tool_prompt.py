"""Tools and tool turns of a conversation as chat messages every chat template can render.

The default model's template (SmolLM2-Instruct: plain ChatML) knows nothing of tools, so the
gateway writes them in the Hermes convention that `--tool-call-parser hermes` reads back:
  * the tools: a system message (added, or appended to the first one) listing each function's
    JSON signature inside <tools></tools> and asking for <tool_call>{...}</tool_call> replies;
  * an assistant message's `tool_calls`: `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`
    after its content;
  * a `tool` message (a call's result): role `tool`, content inside <tool_response></tool_response>.
"""

import json

from shared.pb.pdserve.v1 import gateway_pb2

from services.gateway.http.schemas import ChatMessage, FunctionDefinition, ToolCall

TOOLS_PREAMBLE = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user query. "
    "Don't make assumptions about what values to plug into functions. Here are the available tools:\n"
    "<tools>\n{tools}\n</tools>\n"
    "For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>')


def with_tool_turns(rendered: list[gateway_pb2.ChatMessage], messages: list[ChatMessage],
                    tools: list[FunctionDefinition]) -> list[gateway_pb2.ChatMessage]:
    """`rendered` (the messages' roles and text) with tool calls, results and tools written in."""
    result = []
    for proto, message in zip(rendered, messages):
        if message.tool_calls:
            calls = "\n".join(_call_text(call) for call in message.tool_calls)
            proto.content = f"{proto.content}\n{calls}" if proto.content else calls
        elif proto.role == "tool":
            proto.content = f"<tool_response>\n{proto.content}\n</tool_response>"
        result.append(proto)
    return _with_tools_listed(result, tools) if tools else result


def _call_text(call: ToolCall) -> str:
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        arguments = call.function.arguments  # kept as the client wrote it
    body = json.dumps({"name": call.function.name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _with_tools_listed(rendered: list[gateway_pb2.ChatMessage],
                       tools: list[FunctionDefinition]) -> list[gateway_pb2.ChatMessage]:
    signatures = "\n".join(json.dumps({"type": "function", "function": tool.model_dump(exclude_none=True)},
                                      ensure_ascii=False) for tool in tools)
    preamble = TOOLS_PREAMBLE.format(tools=signatures)
    if rendered and rendered[0].role == "system":
        rendered[0].content = f"{rendered[0].content}\n\n{preamble}"
        return rendered
    return [gateway_pb2.ChatMessage(role="system", content=preamble), *rendered]
