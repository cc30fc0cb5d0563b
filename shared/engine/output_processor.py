"""Turns the engine core's token-level outputs into per-request outputs: text, stop strings,
logprobs, n > 1 groups.

It runs where the text work belongs: next to the core in one thread (`LLMEngine`), or in the
service process while the core steps in its own process (shared.engine.core_process). After
each step, `process` takes the core's outputs; a stop string ends the completion at the token
that completed it (later tokens of the same step are dropped) and is reported back so the
caller finishes that engine request in the core. A completion whose text pipeline raises
(detokenizer, stop strings) ends alone with finish reason "error", likewise reported back.
Outputs for completions that already ended here (the core stepped before it heard) are ignored.
"""

import time
from dataclasses import dataclass, field

from shared.engine.core_outputs import EngineCoreOutput, child_request_id
from shared.engine_api.outputs import CompletionOutput, FinishReason, RequestOutput, SampledLogprobs
from shared.isolation import describe_error
from shared.kv_transfer.types import KVTransferResult
from shared.sampling.params import SamplingParams
from shared.tokenization.detokenizer import IncrementalDetokenizer
from shared.tokenization.stop_strings import StopStringMatcher


class CompletionState:
    """One completion's text pipeline: detokenizer -> stop-string matcher -> output."""

    def __init__(self, index: int, context_token_ids: list[int], params: SamplingParams, tokenizer):
        """`context_token_ids`: the prompt (with any resumed outputs: context, never emitted)."""
        self.output = CompletionOutput(index=index, logprobs=[] if params.logprobs is not None else None)
        self.detokenizer = (IncrementalDetokenizer(tokenizer, list(context_token_ids), params.skip_special_tokens)
                            if tokenizer is not None else None)
        self.matcher = StopStringMatcher(list(params.stop), params.include_stop_str_in_output)

    def add_token(self, token_id: int, logprobs: SampledLogprobs | None) -> None:
        self.output.token_ids.append(token_id)
        self.output.delta_token_ids.append(token_id)
        if self.output.logprobs is not None and logprobs is not None:
            self.output.logprobs.append(logprobs)
        if self.detokenizer is not None:
            self._emit(self.matcher.push(self.detokenizer.add_tokens([token_id]))[0])

    @property
    def stop_string(self) -> str | None:
        return self.matcher.matched_stop

    @property
    def finished(self) -> bool:
        return self.output.finish_reason is not None

    def finish(self, reason: FinishReason, stop_reason: int | str | None) -> None:
        if self.detokenizer is not None and not self.matcher.is_stopped:
            self._emit(self.matcher.push(self.detokenizer.flush())[0] + self.matcher.flush())
        self.output.finish_reason = reason
        self.output.stop_reason = stop_reason

    def fail(self, error: str) -> None:
        """End with finish reason "error" (no flush: the text pipeline may be what failed)."""
        self.output.finish_reason = FinishReason.ERROR
        self.output.error = error

    def _emit(self, text: str) -> None:
        self.output.text += text
        self.output.delta_text += text


@dataclass
class RequestGroup:
    request_id: str
    prompt_token_ids: list[int]
    completions: list[CompletionState]
    prompt_logprobs: list[SampledLogprobs] | None = None
    num_cached_tokens: int = 0
    child_ids: list[str] = field(default_factory=list)
    # time.monotonic() of its arrival here, and of the first step that scheduled it (core).
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    # A request whose prompt KV was sent: what moved, or why it did not (final output).
    kv_transfer: KVTransferResult | None = None
    kv_transfer_error: str | None = None

    @property
    def finished(self) -> bool:
        return all(state.finished for state in self.completions)

    def snapshot(self) -> RequestOutput:
        """A copy of the current results; deltas restart empty afterwards."""
        outputs = []
        for state in self.completions:
            out = state.output
            outputs.append(CompletionOutput(
                out.index, list(out.token_ids), out.text, list(out.logprobs) if out.logprobs is not None else None,
                out.finish_reason, out.stop_reason, out.delta_text, list(out.delta_token_ids), out.error))
            out.delta_text, out.delta_token_ids = "", []
        return RequestOutput(self.request_id, self.prompt_token_ids, outputs,
                             list(self.prompt_logprobs) if self.prompt_logprobs is not None else None,
                             self.num_cached_tokens, self.arrival_time, self.first_scheduled_time,
                             self.kv_transfer, self.kv_transfer_error)


@dataclass
class ProcessedOutputs:
    request_outputs: list[RequestOutput] = field(default_factory=list)
    # Engine requests the core must end: a stop string matched / the text pipeline failed.
    stopped_ids: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.groups: dict[str, RequestGroup] = {}
        self._child_of: dict[str, tuple[RequestGroup, int]] = {}

    def add_group(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                  num_resumed_output_tokens: int = 0) -> list[str]:
        """Start tracking a request; `prompt_token_ids` as submitted (a resumed request's
        earlier outputs at its end). Returns its engine request ids."""
        child_ids = [child_request_id(request_id, index, params.n) for index in range(params.n)]
        prompt = list(prompt_token_ids[:len(prompt_token_ids) - num_resumed_output_tokens])
        group = RequestGroup(request_id, prompt,
                             [CompletionState(index, prompt_token_ids, params, self.tokenizer)
                              for index in range(params.n)],
                             [] if params.prompt_logprobs is not None else None, child_ids=child_ids,
                             arrival_time=time.monotonic())
        self.groups[request_id] = group
        for index, child_id in enumerate(child_ids):
            self._child_of[child_id] = (group, index)
        return child_ids

    def has_group(self, request_id: str) -> bool:
        return request_id in self.groups

    def process(self, core_outputs: list[EngineCoreOutput]) -> ProcessedOutputs:
        """The outputs of groups that changed, and the engine requests to end in the core."""
        result = ProcessedOutputs()
        touched: dict[str, RequestGroup] = {}
        for core_output in core_outputs:
            group, index = self._child_of.get(core_output.request_id, (None, 0))
            if group is None:
                continue  # ended here already, or never tracked (another caller's request)
            if index == 0 and group.prompt_logprobs is not None:
                group.prompt_logprobs.extend(core_output.new_prompt_logprobs)
            state = group.completions[index]
            if state.finished or not (core_output.new_token_ids or core_output.finished):
                continue
            if index == 0:
                self._update_group(group, core_output)
            self._update_completion(state, core_output, result)
            touched[group.request_id] = group
        result.request_outputs = [self._emit(group) for group in touched.values()]
        return result

    @staticmethod
    def _update_group(group: RequestGroup, core_output: EngineCoreOutput) -> None:
        group.num_cached_tokens = core_output.num_cached_tokens
        group.first_scheduled_time = group.first_scheduled_time or core_output.first_scheduled_time
        if core_output.finished:
            group.kv_transfer, group.kv_transfer_error = core_output.kv_transfer, core_output.kv_transfer_error

    def _update_completion(self, state: CompletionState, core_output: EngineCoreOutput,
                           result: ProcessedOutputs) -> None:
        try:
            is_stopped_early = self._add_new_tokens(state, core_output)
            if core_output.finish_reason == FinishReason.ERROR:
                state.fail(core_output.error or "the request failed")
            elif core_output.finished and not is_stopped_early:
                state.finish(core_output.finish_reason, core_output.stop_reason)
            elif state.stop_string is not None:
                state.finish(FinishReason.STOP, state.stop_string)
                if not core_output.finished:
                    result.stopped_ids.append(core_output.request_id)
        except Exception as error:  # noqa: BLE001 - this completion alone fails
            state.fail(f"output processing failed: {describe_error(error)}")
            if not core_output.finished:
                result.failed[core_output.request_id] = state.output.error

    @staticmethod
    def _add_new_tokens(state: CompletionState, core_output: EngineCoreOutput) -> bool:
        """Add the new tokens up to a stop string; True when the stop string ended the
        completion before the last of them (the later tokens are dropped)."""
        new_token_ids = core_output.new_token_ids
        for position, token_id in enumerate(new_token_ids):
            logprobs = core_output.new_logprobs[position] if core_output.new_logprobs else None
            state.add_token(token_id, logprobs)
            if state.stop_string is not None:
                return position < len(new_token_ids) - 1
        return False

    def abort_group(self, request_id: str) -> RequestOutput | None:
        group = self.groups.get(request_id)
        if group is None:
            return None
        for state in group.completions:
            if not state.finished:
                state.finish(FinishReason.ABORT, None)
        return self._emit(group)

    def fail_all(self, error: str) -> list[RequestOutput]:
        """The core is gone: every unfinished completion ends with finish reason "error"."""
        outputs = []
        for group in list(self.groups.values()):
            for state in group.completions:
                if not state.finished:
                    state.fail(error)
            outputs.append(self._emit(group))
        return outputs

    def _emit(self, group: RequestGroup) -> RequestOutput:
        output = group.snapshot()
        if output.finished:
            del self.groups[group.request_id]
            for child_id in group.child_ids:
                del self._child_of[child_id]
        return output
