"""`/v1/completions` choices: `{"index", "text", "logprobs", "finish_reason", "stop_reason"}`."""

from shared.pb.pdserve.v1 import generation_pb2

from services.gateway.http.builder import ChoiceState, ResponseBuilder
from services.gateway.http.logprobs import completion_logprobs


class CompletionBuilder(ResponseBuilder):
    object_name = "text_completion"
    chunk_object_name = "text_completion"  # OpenAI streams completions under the same name

    def __init__(self, *args, wants_logprobs: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.wants_logprobs = wants_logprobs

    def choice_delta(self, choice: ChoiceState, message: generation_pb2.GenerateResponse,
                     offset: int) -> dict:
        logprobs = None
        if self.wants_logprobs:
            logprobs = completion_logprobs(message.logprobs, self.texts, offset)
        return self._choice(choice, message.text, logprobs)

    def choice_final(self, choice: ChoiceState) -> dict:
        logprobs = completion_logprobs(choice.logprobs, self.texts, 0) if self.wants_logprobs else None
        return self._choice(choice, choice.text, logprobs)

    @staticmethod
    def _choice(choice: ChoiceState, text: str, logprobs: dict | None) -> dict:
        return {"index": choice.index, "text": text, "logprobs": logprobs,
                "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason}
