"""`/v1/completions` choices: `{"index", "text", "logprobs", "finish_reason", "stop_reason"}`,
plus `prompt_logprobs` (vLLM's field) when asked for.

With `echo`, each choice's text starts with its prompt and, with `logprobs`, its logprobs
with the prompt tokens' (null for the first token). `max_tokens: 0` with echo is sent to the
engine as max_tokens 1 (one prefill, as vLLM does) and the generated token is dropped here:
the choice is the prompt alone, finish_reason "length", 0 completion tokens. Streamed, each
choice's first chunk carries the echo; a choice whose prompt logprobs have not arrived yet
(they come on the first message of the prompt's first completion) is held back until they do.
"""

from dataclasses import dataclass

from shared.pb.pdserve.v1 import generation_pb2

from services.gateway.http.builder import ChoiceState, ResponseBuilder
from services.gateway.http.logprobs import completion_logprobs
from services.gateway.http.prompt_logprobs import concatenated, echoed_prompt_logprobs, vllm_prompt_logprobs


@dataclass(frozen=True)
class EchoedPrompt:
    text: str  # as the client sent it (token-id prompts: decoded)
    token_ids: list[int]


class CompletionBuilder(ResponseBuilder):
    object_name = "text_completion"
    chunk_object_name = "text_completion"  # OpenAI streams completions under the same name

    def __init__(self, *args, num_logprobs: int | None = None, echo: list[EchoedPrompt] | None = None,
                 is_echo_only: bool = False, num_prompt_logprobs: int | None = None, **kwargs):
        """`num_logprobs`, `num_prompt_logprobs`: None when not asked for; `echo`: per prompt."""
        super().__init__(*args, **kwargs)
        self.num_logprobs = num_logprobs
        self.echo = echo
        self.is_echo_only = is_echo_only
        self.num_prompt_logprobs = num_prompt_logprobs
        self.prompt_entries: dict[int, list[generation_pb2.PositionLogprobs]] = {}
        self.held: dict[int, list[generation_pb2.GenerateResponse]] = {}

    def add(self, prompt_index: int, message: generation_pb2.GenerateResponse) -> tuple[ChoiceState, int]:
        if message.prompt_logprobs:
            self.prompt_entries[prompt_index] = list(message.prompt_logprobs)
        if self.is_echo_only:
            message = _without_generation(message)
        return super().add(prompt_index, message)

    def new_choice(self, prompt_index: int, index: int) -> ChoiceState:
        return ChoiceState(index, text=self.echo[prompt_index].text if self.echo else "")

    def chunks(self, prompt_index: int, message: generation_pb2.GenerateResponse) -> list[dict]:
        if message.prompt_logprobs:
            self.prompt_entries[prompt_index] = list(message.prompt_logprobs)
        if self._awaits_prompt_logprobs(prompt_index):
            self.held.setdefault(prompt_index, []).append(message)
            return []
        held = self.held.pop(prompt_index, [])
        return [self.chunk(prompt_index, earlier) for earlier in held] + [self.chunk(prompt_index, message)]

    def closing_chunks(self) -> list[dict]:
        held, self.held = self.held, {}
        return [self.chunk(prompt_index, message) for prompt_index, messages in sorted(held.items())
                for message in messages]

    def chunk(self, prompt_index: int, message: generation_pb2.GenerateResponse) -> dict:
        index = prompt_index * self.n + message.index
        is_first = index not in self.choices
        num_entries_before = 0 if is_first else len(self.choices[index].logprobs)
        choice, offset = self.add(prompt_index, message)
        if is_first:  # the whole text so far: the echo, if any, and this message's
            offset, num_entries_before = 0, 0
        item = self._choice(choice, choice.text[offset:],
                            self._logprobs(prompt_index, choice.logprobs[num_entries_before:], offset))
        if is_first:
            self._add_prompt_logprobs(item, prompt_index)
        return self.envelope(self.chunk_object_name, [item])

    def choice_final(self, choice: ChoiceState) -> dict:
        prompt_index = choice.index // self.n
        item = self._choice(choice, choice.text, self._logprobs(prompt_index, choice.logprobs, 0))
        self._add_prompt_logprobs(item, prompt_index)
        return item

    def _logprobs(self, prompt_index: int, entries: list, offset: int) -> dict | None:
        """Logprobs of the text from `offset` on (offset 0 with echo: the prompt's first)."""
        if self.num_logprobs is None:
            return None
        if not self.echo or offset > 0:
            return completion_logprobs(entries, self.texts, offset)
        prompt = self.echo[prompt_index]
        return concatenated(
            echoed_prompt_logprobs(prompt.token_ids, self.prompt_entries.get(prompt_index, []), self.texts,
                                   self.num_logprobs),
            completion_logprobs(entries, self.texts, len(prompt.text)))

    def _add_prompt_logprobs(self, item: dict, prompt_index: int) -> None:
        if self.num_prompt_logprobs is not None:
            item["prompt_logprobs"] = vllm_prompt_logprobs(self.prompt_entries.get(prompt_index, []),
                                                           self.texts, self.num_prompt_logprobs)

    def _awaits_prompt_logprobs(self, prompt_index: int) -> bool:
        wants = self.num_prompt_logprobs is not None or (self.echo is not None and self.num_logprobs is not None)
        if not wants or prompt_index in self.prompt_entries:
            return False
        return not self.echo or len(self.echo[prompt_index].token_ids) > 1  # one token: none come

    @staticmethod
    def _choice(choice: ChoiceState, text: str, logprobs: dict | None) -> dict:
        return {"index": choice.index, "text": text, "logprobs": logprobs,
                "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason}


def _without_generation(message: generation_pb2.GenerateResponse) -> generation_pb2.GenerateResponse:
    """The message with its generated token dropped (echo with max_tokens 0)."""
    kept = generation_pb2.GenerateResponse()
    kept.CopyFrom(message)
    for name in ("text", "token_ids", "logprobs", "stop_reason"):
        kept.ClearField(name)
    if kept.finish_reason != generation_pb2.FINISH_REASON_UNSPECIFIED:
        kept.finish_reason = generation_pb2.FINISH_REASON_LENGTH
    if kept.HasField("usage"):
        kept.usage.completion_tokens = 0
    return kept
