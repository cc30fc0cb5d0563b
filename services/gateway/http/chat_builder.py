"""`/v1/chat/completions` choices: whole `message`s, or streamed `delta`s (each choice opens
with a `{"role": "assistant"}` delta, as OpenAI's stream does)."""

from shared.pb.pdserve.v1 import generation_pb2

from services.gateway.http.builder import ChoiceState, ResponseBuilder
from services.gateway.http.logprobs import chat_logprobs

ROLE = "assistant"


class ChatBuilder(ResponseBuilder):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(self, *args, num_top_logprobs: int | None = None, **kwargs):
        """`num_top_logprobs`: None when the client did not ask for logprobs."""
        super().__init__(*args, **kwargs)
        self.num_top_logprobs = num_top_logprobs

    def opening_chunks(self) -> list[dict]:
        return [self.envelope(self.chunk_object_name, [{
            "index": index, "delta": {"role": ROLE, "content": ""}, "logprobs": None,
            "finish_reason": None}]) for index in range(self.n)]

    def choice_delta(self, choice: ChoiceState, message: generation_pb2.GenerateResponse,
                     offset: int) -> dict:
        delta = {"content": message.text} if message.text else {}
        return {"index": choice.index, "delta": delta, "logprobs": self._logprobs(message.logprobs),
                "finish_reason": choice.finish_reason if message.finish_reason else None,
                "stop_reason": choice.stop_reason}

    def choice_final(self, choice: ChoiceState) -> dict:
        return {"index": choice.index, "message": {"role": ROLE, "content": choice.text},
                "logprobs": self._logprobs(choice.logprobs), "finish_reason": choice.finish_reason,
                "stop_reason": choice.stop_reason}

    def _logprobs(self, entries) -> dict | None:
        if self.num_top_logprobs is None:
            return None
        return chat_logprobs(entries, self.texts, self.num_top_logprobs)
