"""Tool calls out of generated text, incrementally: the same parser serves streamed deltas and
whole responses (fed the whole text at once), so both always agree.

A call is a JSON object `{"name": ..., "arguments": {...}}` ("parameters" is accepted for
"arguments", as the guided `"required"` format writes it). Once the head up to the arguments
has arrived, the call's name is reported, then the arguments' raw JSON text piece by piece as
it arrives; a call whose keys come in another order is reported whole when it closes.
  * `ArgumentsParser` (a named function): all the text is the arguments.
  * `CallListParser` (`"required"`): a JSON array of calls (also a lone call).
  * `HermesParser` (`"auto"`, `--tool-call-parser hermes`): free text, with calls inside
    `<tool_call>...</tool_call>` (one call or a list of them); the text outside is content.
"""

import json
import re
from dataclasses import dataclass, field

CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
START_TAG, END_TAG = "<tool_call>", "</tool_call>"


@dataclass
class ToolEvents:
    """What one piece of text added: content, new calls (index, name), argument pieces (index, text)."""

    content: str = ""
    names: list[tuple[int, str]] = field(default_factory=list)
    arguments: list[tuple[int, str]] = field(default_factory=list)

    def extend(self, other: "ToolEvents") -> None:
        self.content += other.content
        self.names += other.names
        self.arguments += other.arguments


class JsonValueEnd:
    """Finds where one JSON object or array ends, fed piece by piece (strings understood)."""

    def __init__(self):
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.is_done = False

    def feed(self, text: str) -> int:
        """How many characters of `text` belong to the value (all of them until it closes)."""
        for position, char in enumerate(text):
            if self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (char == "\\", char != '"')
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.is_done = True
                    return position + 1
        return len(text)


class CallParser:
    """One call object; `feed` returns the characters after its end, or None while it is open."""

    def __init__(self, index: int):
        self.index = index
        self.whole = JsonValueEnd()
        self.text = ""
        self.arguments_start: int | None = None  # in self.text, once the head is seen
        self.arguments_end = JsonValueEnd()
        self.num_arguments_sent = 0

    def feed(self, text: str, events: ToolEvents) -> str | None:
        used = self.whole.feed(text)
        self.text += text[:used]
        if self.arguments_start is None:
            head = CALL_HEAD.match(self.text)
            if head:
                self.arguments_start = head.end()
                events.names.append((self.index, _unescaped(head.group(1))))
        if self.arguments_start is not None:
            self._send_arguments(events)
            if self.whole.is_done and not self.num_arguments_sent:  # e.g. a string: the raw value
                events.arguments.append((self.index, self.text[self.arguments_start:].strip()[:-1].strip()))
        elif self.whole.is_done:
            self._send_whole(events)
        return text[used:] if self.whole.is_done else None

    def _send_arguments(self, events: ToolEvents) -> None:
        pending = self.text[self.arguments_start + self.num_arguments_sent:]
        if self.arguments_end.is_done or not pending:
            return
        if not self.arguments_end.depth and pending.lstrip()[:1] not in ("{", "["):
            return  # not an object: sent whole when the call closes
        piece = pending[:self.arguments_end.feed(pending)]
        self.num_arguments_sent += len(piece)
        if piece:
            events.arguments.append((self.index, piece.lstrip() if self.num_arguments_sent == len(piece) else piece))

    def _send_whole(self, events: ToolEvents) -> None:
        try:
            call = json.loads(self.text)
            name, arguments = call["name"], call.get("arguments", call.get("parameters", {}))
        except (ValueError, KeyError, TypeError):
            return  # not a call: dropped
        events.names.append((self.index, str(name)))
        events.arguments.append((self.index, json.dumps(arguments, ensure_ascii=False)))


class CallListParser:
    """Calls one after the other, in a JSON array or not; characters between them are skipped."""

    def __init__(self, first_index: int = 0):
        self.next_index = first_index
        self.call: CallParser | None = None

    def feed(self, text: str, events: ToolEvents) -> None:
        while text:
            if self.call is None:
                start = text.find("{")
                if start < 0:
                    return
                self.call, text = CallParser(self.next_index), text[start:]
                self.next_index += 1
            rest = self.call.feed(text, events)
            if rest is None:
                return
            self.call, text = None, rest


class ArgumentsParser:
    """A named function's call: the whole output is its arguments."""

    def __init__(self, name: str):
        self.name = name
        self.has_started = False

    def feed(self, text: str, events: ToolEvents) -> None:
        if not self.has_started:
            self.has_started = True
            events.names.append((0, self.name))
        if text:
            events.arguments.append((0, text))


class HermesParser:
    """Content, with calls inside <tool_call>...</tool_call>; a partial tag is held back."""

    def __init__(self):
        self.pending = ""
        self.calls: CallListParser | None = None  # inside a tag
        self.num_calls = 0

    def feed(self, text: str, events: ToolEvents) -> None:
        text, self.pending = self.pending + text, ""
        while text:
            tag = END_TAG if self.calls is not None else START_TAG
            found = text.find(tag)
            inside = text if found < 0 else text[:found]
            if found < 0:
                kept = _partial_tag_suffix(inside, tag)
                inside, self.pending = inside[:len(inside) - kept], inside[len(inside) - kept:]
            self._take(inside, events)
            if found < 0:
                return
            text = text[found + len(tag):]
            self._switch()

    def finish(self, events: ToolEvents) -> None:
        """The end of the text: a held-back partial tag was content after all."""
        self._take(self.pending, events)
        self.pending = ""

    def _take(self, text: str, events: ToolEvents) -> None:
        if self.calls is None:
            events.content += text
        else:
            self.calls.feed(text, events)

    def _switch(self) -> None:
        if self.calls is None:
            self.calls = CallListParser(self.num_calls)
        else:
            self.num_calls, self.calls = self.calls.next_index, None


def _unescaped(json_string_body: str) -> str:
    try:
        return json.loads(f'"{json_string_body}"')
    except ValueError:  # a bad escape: the name as written
        return json_string_body


def _partial_tag_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could be the start of `tag`."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0
