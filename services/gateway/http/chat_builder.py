"""`/v1/chat/completions` choices: whole `message`s, or streamed `delta`s (each choice opens
with a `{"role": "assistant"}` delta, as OpenAI's stream does). vLLM's `prompt_logprobs`,
when asked for, is a field of the response (streamed: of the chunk that first can carry it)."""

from shared.pb.pdserve.v1 import generation_pb2

from services.gateway.http.builder import ChoiceState, ResponseBuilder
from services.gateway.http.logprobs import chat_logprobs
from services.gateway.http.prompt_logprobs import vllm_prompt_logprobs
from services.gateway.http.tool_choice import ToolPlan
from services.gateway.http.tool_output import ToolCallStream

ROLE = "assistant"


class ChatBuilder(ResponseBuilder):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(self, *args, num_top_logprobs: int | None = None, num_prompt_logprobs: int | None = None,
                 tools: ToolPlan | None = None, **kwargs):
        """`num_top_logprobs`, `num_prompt_logprobs`: None when the client did not ask for them;
        `tools`: the request's tool plan (None or "none": plain content)."""
        super().__init__(*args, **kwargs)
        self.num_top_logprobs = num_top_logprobs
        self.num_prompt_logprobs = num_prompt_logprobs
        self.prompt_entries: list[generation_pb2.PositionLogprobs] = []
        self.tools = tools if tools is not None and tools.mode != "none" else None
        self.tool_streams: dict[int, ToolCallStream] = {}

    def chunk(self, prompt_index: int, message: generation_pb2.GenerateResponse) -> dict:
        chunk = super().chunk(prompt_index, message)
        if self.num_prompt_logprobs is not None and message.prompt_logprobs:
            chunk["prompt_logprobs"] = self._prompt_logprobs()
        return chunk

    def add(self, prompt_index: int, message: generation_pb2.GenerateResponse):
        if message.prompt_logprobs:
            self.prompt_entries = list(message.prompt_logprobs)
        return super().add(prompt_index, message)

    def response(self) -> dict:
        body = super().response()
        if self.num_prompt_logprobs is not None:
            body["prompt_logprobs"] = self._prompt_logprobs()
        return body

    def _prompt_logprobs(self) -> list[dict | None]:
        return vllm_prompt_logprobs(self.prompt_entries, self.texts, self.num_prompt_logprobs)

    def opening_chunks(self) -> list[dict]:
        return [self.envelope(self.chunk_object_name, [{
            "index": index, "delta": {"role": ROLE, "content": ""}, "logprobs": None,
            "finish_reason": None}]) for index in range(self.n)]

    def choice_delta(self, choice: ChoiceState, message: generation_pb2.GenerateResponse,
                     offset: int) -> dict:
        finish_reason = choice.finish_reason if message.finish_reason else None
        delta = {"content": message.text} if message.text else {}
        if self.tools is not None:
            stream = self.tool_streams.setdefault(choice.index, ToolCallStream(self.tools))
            content, calls = stream.feed(message.text, is_last=finish_reason is not None)
            delta = {**({"content": content} if content else {}), **({"tool_calls": calls} if calls else {})}
            finish_reason = stream.finish_reason(finish_reason)
        return {"index": choice.index, "delta": delta, "logprobs": self._logprobs(message.logprobs),
                "finish_reason": finish_reason, "stop_reason": choice.stop_reason}

    def choice_final(self, choice: ChoiceState) -> dict:
        message, finish_reason = {"role": ROLE, "content": choice.text}, choice.finish_reason
        if self.tools is not None:
            stream = ToolCallStream(self.tools)
            stream.feed(choice.text, is_last=True)
            message, finish_reason = stream.message(), stream.finish_reason(finish_reason)
        return {"index": choice.index, "message": message, "logprobs": self._logprobs(choice.logprobs),
                "finish_reason": finish_reason, "stop_reason": choice.stop_reason}

    def _logprobs(self, entries) -> dict | None:
        if self.num_top_logprobs is None:
            return None
        return chat_logprobs(entries, self.texts, self.num_top_logprobs)
