"""Turns sampled tokens into per-request outputs: text, stop strings, logprobs, n > 1 groups.

The engine calls `process` after every step with the requests that received tokens: one, or
several when speculative decoding accepted proposed tokens. A stop string ends the output at
the token that completed it; later tokens of the same step are dropped. A request whose text
pipeline raises (detokenizer, stop strings) ends alone with finish reason "error".
"""

from dataclasses import dataclass, field

from shared.core.request import Request, RequestStatus
from shared.engine.outputs import CompletionOutput, RequestOutput
from shared.executor.base import ModelRunnerOutput, SampledLogprobs
from shared.isolation import describe_error
from shared.tokenization.detokenizer import IncrementalDetokenizer
from shared.tokenization.stop_strings import StopStringMatcher


class CompletionState:
    """One completion's text pipeline: detokenizer -> stop-string matcher -> output."""

    def __init__(self, index: int, request: Request, tokenizer):
        params = request.sampling_params
        self.output = CompletionOutput(index=index, logprobs=[] if params.logprobs is not None else None)
        # A resumed request's earlier outputs are context for its text, never emitted again.
        self.num_resumed = request.num_resumed_output_tokens
        self.detokenizer = (IncrementalDetokenizer(tokenizer, request.all_token_ids, params.skip_special_tokens)
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

    def finish(self, reason: str, stop_reason: int | str | None) -> None:
        if self.detokenizer is not None and not self.matcher.is_stopped:
            self._emit(self.matcher.push(self.detokenizer.flush())[0] + self.matcher.flush())
        self.output.finish_reason = reason
        self.output.stop_reason = stop_reason

    def fail(self, error: str) -> None:
        """End with finish reason "error" (no flush: the text pipeline may be what failed)."""
        self.output.finish_reason = "error"
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
    requests: list[Request] = field(default_factory=list)

    def snapshot(self) -> RequestOutput:
        """A copy of the current results; deltas restart empty afterwards."""
        outputs = []
        for state in self.completions:
            out = state.output
            outputs.append(CompletionOutput(
                out.index, list(out.token_ids), out.text, list(out.logprobs) if out.logprobs is not None else None,
                out.finish_reason, out.stop_reason, out.delta_text, list(out.delta_token_ids), out.error))
            out.delta_text, out.delta_token_ids = "", []
        first = self.requests[0]
        return RequestOutput(self.request_id, self.prompt_token_ids, outputs,
                             list(self.prompt_logprobs) if self.prompt_logprobs is not None else None,
                             first.num_cached_prompt_tokens, arrival_time=first.arrival_time,
                             first_scheduled_time=first.first_scheduled_time)


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.groups: dict[str, RequestGroup] = {}
        self._child_of: dict[str, tuple[RequestGroup, int]] = {}

    def add_group(self, request_id: str, requests: list[Request]) -> None:
        first = requests[0]
        group = RequestGroup(request_id, first.prompt_token_ids,
                             [CompletionState(i, r, self.tokenizer) for i, r in enumerate(requests)],
                             [] if first.sampling_params.prompt_logprobs is not None else None,
                             requests=requests)
        self.groups[request_id] = group
        for index, request in enumerate(requests):
            self._child_of[request.request_id] = (group, index)

    def process(self, updated: list[Request], runner_output: ModelRunnerOutput
                ) -> tuple[list[RequestOutput], list[Request], list[Request]]:
        """Returns the outputs of groups that changed, the requests that hit a stop string,
        and those whose text pipeline failed (the engine finishes both kinds)."""
        touched: dict[str, RequestGroup] = {}
        for request_id, entries in runner_output.prompt_logprobs.items():
            group, index = self._child_of[request_id]
            if index == 0 and group.prompt_logprobs is not None:
                group.prompt_logprobs.extend(entries)
        stopped_by_string, failed = [], []
        for request in updated:
            group, index = self._child_of[request.request_id]
            state = group.completions[index]
            try:
                if self._update_completion(state, request, runner_output):
                    stopped_by_string.append(request)
            except Exception as error:  # noqa: BLE001 - this request alone fails
                state.fail(f"output processing failed: {describe_error(error)}")
                request.error = state.output.error
                failed.append(request)
            touched[group.request_id] = group
        return [self._emit(group) for group in touched.values()], stopped_by_string, failed

    def _update_completion(self, state: CompletionState, request: Request, runner_output: ModelRunnerOutput) -> bool:
        """Add the request's new tokens and finish the completion if it ended; True when a
        stop string ended it."""
        is_stopped_early = self._add_new_tokens(state, request, runner_output)
        if request.status == RequestStatus.FINISHED_ERROR:
            state.fail(request.error or "the request failed")
        elif request.is_finished and not is_stopped_early:
            state.finish(request.status.finish_reason, request.stop_reason)
        elif state.stop_string is not None:
            state.finish("stop", state.stop_string)
            return True
        return False

    @staticmethod
    def _add_new_tokens(state: CompletionState, request: Request, runner_output: ModelRunnerOutput) -> bool:
        """Add the request's tokens the completion lacks, up to a stop string; True when the
        stop string ended it before the step's last token (the later tokens are dropped)."""
        new_token_ids = request.output_token_ids[state.num_resumed + len(state.output.token_ids):]
        for position, token_id in enumerate(new_token_ids):
            state.add_token(token_id, runner_output.logprobs.get(request.request_id))
            if state.stop_string is not None:
                return position < len(new_token_ids) - 1
        return False

    def abort_group(self, request_id: str) -> RequestOutput | None:
        group = self.groups.get(request_id)
        if group is None:
            return None
        for state in group.completions:
            if state.output.finish_reason is None:
                state.finish("abort", None)
        return self._emit(group)

    def _emit(self, group: RequestGroup) -> RequestOutput:
        output = group.snapshot()
        if output.finished:
            del self.groups[group.request_id]
            for request in group.requests:
                del self._child_of[request.request_id]
        return output
