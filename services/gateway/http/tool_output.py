"""One chat choice's generated text as OpenAI's `content` and `tool_calls`, streamed as deltas
or whole, by the parser the request's tool plan calls for (services.gateway.http.tool_parser).

Streamed: a call opens with `{"index", "id", "type": "function", "function": {"name",
"arguments": ""}}` and its arguments follow as `{"index", "function": {"arguments": piece}}`.
finish_reason "stop" becomes "tool_calls" when `"required"` or `"auto"` produced calls (a named
function keeps "stop", as OpenAI answers a forced function).
"""

import uuid

from services.gateway.http.tool_choice import ToolPlan
from services.gateway.http.tool_parser import (
    ArgumentsParser, CallListParser, HermesParser, ToolEvents)


class ToolCallStream:
    def __init__(self, plan: ToolPlan):
        self.plan = plan
        if plan.mode == "named":
            self.parser = ArgumentsParser(plan.named)
        elif plan.mode == "required":
            self.parser = CallListParser()
        else:
            self.parser = HermesParser()
        self.calls: dict[int, dict] = {}
        self.content = ""

    def feed(self, text: str, is_last: bool = False) -> tuple[str, list[dict]]:
        """(new content, tool-call deltas) for the next piece of text."""
        events = ToolEvents()
        self.parser.feed(text, events)
        if is_last and isinstance(self.parser, HermesParser):
            self.parser.finish(events)
        self.content += events.content
        deltas: dict[int, dict] = {}
        for index, name in events.names:
            call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": name, "arguments": ""}}
            self.calls[index] = call
            deltas[index] = {"index": index, **call, "function": dict(call["function"])}
        for index, piece in events.arguments:
            self.calls[index]["function"]["arguments"] += piece
            delta = deltas.setdefault(index, {"index": index, "function": {"arguments": ""}})
            delta["function"]["arguments"] += piece
        return events.content, list(deltas.values())

    def finish_reason(self, reason: str | None) -> str | None:
        if reason == "stop" and self.calls and self.plan.mode in ("required", "auto"):
            return "tool_calls"
        return reason

    def message(self) -> dict:
        """The whole assistant message, once all the text has been fed."""
        message = {"role": "assistant", "content": self.content or None}
        if self.calls:
            message["tool_calls"] = [self.calls[index] for index in sorted(self.calls)]
        return message
