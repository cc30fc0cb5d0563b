"""The engine's guided-decoding hooks: compile at admission, mask before sampling, advance after.

`LLMEngine` owns one `GuidedDecoding` and calls it at four points:
  * `admit(children)` in add_request / reserve_request: compiles the constraint (errors name
    the field, before any compute) and gives each request (each n > 1 child) its own matcher,
    kept on the `Request` so preemption and recompute leave it untouched;
  * `prepare_step(scheduled, requests)` between schedule() and execute: fills one bitmask for
    the step's constrained sampling rows and hands each row to its `ScheduledRequest`;
  * `advance(requests)` once the scheduler has appended the sampled tokens (and from
    activate_request, with the prefill instance's first token): feeds each matcher its token
    and says which requests to finish.
A matcher that accepts an EOS token has terminated: the request ends with reason "stop" (also
under ignore_eos, and before min_tokens: once the grammar allows only EOS, the sampler stops
hiding it). Reaching max_tokens mid-grammar ends it with "length" as usual.
"""

import logging
from collections.abc import Sequence

from shared.core.request import Request, RequestStatus
from shared.core.scheduler_output import ScheduledRequest
from shared.errors import InvalidRequestError
from shared.guided.bitmask import fill_bitmask

logger = logging.getLogger(__name__)


class GuidedDecoding:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Sequence[int]):
        """`tokenizer` None: the engine has none and refuses guided requests."""
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self._grammars = None

    @property
    def grammars(self):
        """The `GrammarCache`, built (and XGrammar imported) on the first guided request."""
        if self._grammars is None:
            if self._tokenizer is None:
                raise InvalidRequestError("guided", "guided decoding needs the model's tokenizer, "
                                                    "and this engine has none")
            from shared.guided.compiler import GrammarCache, tokenizer_info
            info = tokenizer_info(self._tokenizer, self.vocab_size, self.stop_token_ids)
            self._grammars = GrammarCache(info)
        return self._grammars

    def use_grammar_cache(self, grammars) -> None:
        """Use a prepared `GrammarCache` (tests with a hand-made vocabulary)."""
        self._grammars = grammars

    def admit(self, requests: Sequence[Request]) -> None:
        """Compile the requests' shared constraint and give each its own matcher."""
        guided = requests[0].sampling_params.guided
        if guided is None:
            return
        import xgrammar as xgr
        compiled = self.grammars.compile(guided)
        for request in requests:
            request.guided_matcher = xgr.GrammarMatcher(compiled)

    def prepare_step(self, scheduled: Sequence[ScheduledRequest], requests: dict[str, Request]) -> None:
        """Set `guided_bitmask` on every sampling row whose request has a matcher."""
        rows = [item for item in scheduled if item.sampling_params is not None
                and requests[item.request_id].guided_matcher is not None]
        if not rows:
            return
        matchers = [requests[item.request_id].guided_matcher for item in rows]
        bitmask, restricts = fill_bitmask(matchers, self.vocab_size)
        for index, item in enumerate(rows):
            item.guided_bitmask = bitmask[index] if restricts[index] else None

    def advance(self, requests: Sequence[Request]) -> list[tuple[Request, RequestStatus]]:
        """Feed each unfinished guided request its newest token; returns the requests to
        finish: "stop" once the matcher terminated, "abort" if it refused the token."""
        to_finish = []
        for request in requests:
            matcher = request.guided_matcher
            if matcher is None or request.is_finished:
                continue
            token_id = request.output_token_ids[-1]
            if not matcher.accept_token(token_id):
                logger.warning("request %s: token %d breaks its %s constraint; aborting",
                               request.request_id, token_id, request.sampling_params.guided.kind)
                to_finish.append((request, RequestStatus.FINISHED_ABORTED))
            elif matcher.is_terminated():
                to_finish.append((request, RequestStatus.FINISHED_STOPPED))
        return to_finish
