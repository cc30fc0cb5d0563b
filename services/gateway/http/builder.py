"""The state of one OpenAI response while the gateway's messages arrive, and its JSON.

`ResponseBuilder` is fed (prompt index, GenerateResponse) pairs as they come from the relay.
Streaming, `chunks()` turns each into SSE chunks (usually one; a subclass may hold a message
back until what it needs has arrived, and `closing_chunks()` flushes what is held);
otherwise `add()` accumulates and `response()` builds the whole answer. Choice index =
prompt index * n + completion index. Subclasses (completions, chat) shape the choices; this
class owns the envelope and usage (in every chunk with `continuous_usage`: the request's
running totals, which end equal to the final usage).
"""

from dataclasses import dataclass, field

from shared.pb.pdserve.v1 import generation_pb2
from shared.wire.outputs import finish_reason_from_proto

from services.gateway.http.logprobs import TokenTexts



@dataclass
class ChoiceState:
    index: int
    text: str = ""
    logprobs: list[generation_pb2.PositionLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def add(self, message: generation_pb2.GenerateResponse) -> int:
        """Append a message's delta; returns where its text starts in the choice's text."""
        offset = len(self.text)
        self.text += message.text
        self.logprobs.extend(message.logprobs)
        if message.finish_reason != generation_pb2.FINISH_REASON_UNSPECIFIED:
            self.finish_reason = finish_reason_from_proto(message.finish_reason).value
            kind = message.WhichOneof("stop_reason")
            self.stop_reason = getattr(message, kind) if kind else None
        return offset


@dataclass
class UsageTotal:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def add(self, usage: generation_pb2.Usage) -> None:
        self.prompt_tokens += usage.prompt_tokens
        self.completion_tokens += usage.completion_tokens
        self.cached_tokens += usage.cached_prompt_tokens

    def to_json(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


class ResponseBuilder:
    object_name = ""  # set by subclasses
    chunk_object_name = ""

    def __init__(self, response_id: str, model_name: str, created: int, n: int, texts: TokenTexts,
                 include_usage: bool = False, continuous_usage: bool = False, num_prompt_tokens: int = 0):
        """`num_prompt_tokens`: of all prompts, for the running usage of `continuous_usage`."""
        self.response_id = response_id
        self.model_name = model_name
        self.created = created
        self.n = n
        self.texts = texts
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.choices: dict[int, ChoiceState] = {}
        self.usage = UsageTotal()
        self.running = UsageTotal(prompt_tokens=num_prompt_tokens)

    def add(self, prompt_index: int, message: generation_pb2.GenerateResponse) -> tuple[ChoiceState, int]:
        index = prompt_index * self.n + message.index
        if index not in self.choices:
            self.choices[index] = self.new_choice(prompt_index, index)
        choice = self.choices[index]
        if message.HasField("usage"):
            self.usage.add(message.usage)
        self.running.completion_tokens += len(message.token_ids)
        return choice, choice.add(message)

    def new_choice(self, prompt_index: int, index: int) -> ChoiceState:
        return ChoiceState(index)

    def chunks(self, prompt_index: int, message: generation_pb2.GenerateResponse) -> list[dict]:
        """The SSE chunks to send for this message (none while it is held back)."""
        return [self.chunk(prompt_index, message)]

    def chunk(self, prompt_index: int, message: generation_pb2.GenerateResponse) -> dict:
        choice, offset = self.add(prompt_index, message)
        return self.envelope(self.chunk_object_name, [self.choice_delta(choice, message, offset)])

    def opening_chunks(self) -> list[dict]:
        """Chunks sent before the first token (chat: each choice's role)."""
        return []

    def closing_chunks(self) -> list[dict]:
        """Chunks still held back when the last message has arrived."""
        return []

    def usage_chunk(self) -> dict:
        """The last chunk when the client asked for `stream_options.include_usage`."""
        chunk = self.envelope(self.chunk_object_name, [])
        chunk["usage"] = self.usage.to_json()
        return chunk

    def response(self) -> dict:
        choices = [self.choice_final(self.choices[i]) for i in sorted(self.choices)]
        body = self.envelope(self.object_name, choices)
        body["usage"] = self.usage.to_json()
        return body

    def envelope(self, object_name: str, choices: list[dict]) -> dict:
        body = {"id": self.response_id, "object": object_name, "created": self.created,
                "model": self.model_name, "choices": choices}
        if self.continuous_usage:  # (streaming only; whole responses set their final usage)
            body["usage"] = self.running.to_json()
        elif self.include_usage:
            body["usage"] = None
        return body

    def choice_delta(self, choice: ChoiceState, message: generation_pb2.GenerateResponse,
                     offset: int) -> dict:
        raise NotImplementedError

    def choice_final(self, choice: ChoiceState) -> dict:
        raise NotImplementedError
