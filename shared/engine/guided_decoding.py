"""The engine's guided-decoding hooks: compile at admission, mask before sampling, advance after.

`LLMEngine` owns one `GuidedDecoding`. Services first `await prepare(guided)`: it checks the
size limits (`shared.guided.limits`) and compiles on this object's worker threads, never on
the engine's step loop, giving up after `compile_timeout_s`; meanwhile the request waits
outside the scheduler and other requests keep stepping. The engine then calls it at:
  * `admit(children)` in add_request / reserve_request: checks the limits, takes the compiled
    constraint (from the cache when prepared; the offline API compiles here) and gives each
    request (each n > 1 child) its own matcher, kept on the `Request` so preemption and
    recompute leave it untouched;
  * `prepare_step(scheduled, requests)` between schedule() and execute: fills one bitmask for
    the step's constrained sampling rows and hands each row to its `ScheduledRequest`; a row
    whose matcher fails, or allows no token at all, is returned as failed (the engine ends
    that request with an error; the others keep their masks);
  * `advance(requests)` once the scheduler has appended the sampled tokens (and from
    activate_request, with the prefill instance's first token): feeds each matcher its token
    and says which requests to finish.
A matcher that accepts an EOS token has terminated: the request ends with reason "stop" (also
under ignore_eos, and before min_tokens: once the grammar allows only EOS, the sampler stops
hiding it). Reaching max_tokens mid-grammar ends it with "length" as usual.
"""

import asyncio
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from shared.core.request import Request, RequestStatus
from shared.core.scheduler_output import ScheduledRequest
from shared.errors import InvalidRequestError
from shared.guided.bitmask import allows_no_token, fill_bitmask
from shared.guided.limits import GuidedLimits, check_guided_limits
from shared.guided.params import GuidedDecodingParams
from shared.isolation import describe_error, run_isolated

logger = logging.getLogger(__name__)


class NoAllowedTokenError(RuntimeError):
    """A guided row's constraint leaves no token to sample."""


class GuidedDecoding:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Sequence[int],
                 limits: GuidedLimits | None = None):
        """`tokenizer` None: the engine has none and refuses guided requests."""
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self.limits = limits or GuidedLimits()
        self._grammars = None
        self._grammars_lock = threading.Lock()  # the engine thread and the event loop both build it
        self._compile_pool: ThreadPoolExecutor | None = None
        # Compilations in progress by (kind, text), shared by the requests waiting for them.
        self._compiling: dict[tuple[str, str], asyncio.Future] = {}

    @property
    def grammars(self):
        """The `GrammarCache`, built (and XGrammar imported) on the first guided request."""
        with self._grammars_lock:
            if self._grammars is None:
                if self._tokenizer is None:
                    raise InvalidRequestError("guided", "guided decoding needs the model's tokenizer, "
                                                        "and this engine has none")
                from shared.guided.compiler import GrammarCache, tokenizer_info
                info = tokenizer_info(self._tokenizer, self.vocab_size, self.stop_token_ids)
                self._grammars = GrammarCache(info, max_entries=self.limits.max_cached_grammars)
            return self._grammars

    async def prepare(self, guided: GuidedDecodingParams | None) -> None:
        """Check the limits and compile into the cache on a worker thread; InvalidRequestError
        naming the field when too big, invalid, or not compiled within the time limit (the
        compilation then finishes in the background, bounded by the size limits)."""
        if guided is None:
            return
        check_guided_limits(guided, self.limits)
        compiling = self._compilation_of(guided)
        try:
            # shield: a request that gives up leaves the shared compilation running for the cache.
            await asyncio.wait_for(asyncio.shield(compiling), self.limits.compile_timeout_s)
        except TimeoutError:
            raise InvalidRequestError(guided.field_name, f"took longer than {self.limits.compile_timeout_s:g} s "
                                                         "to compile; simplify it") from None

    def _compilation_of(self, guided: GuidedDecodingParams) -> asyncio.Future:
        """The compilation of `guided` on the worker threads; requests asking for a constraint
        already being compiled share it instead of compiling it again."""
        key = (guided.kind, guided.text)
        compiling = self._compiling.get(key)
        if compiling is None:
            if self._compile_pool is None:
                self._compile_pool = ThreadPoolExecutor(self.limits.num_compile_threads, thread_name_prefix="grammar")
            compiling = asyncio.get_running_loop().run_in_executor(self._compile_pool, self.grammars.compile, guided)
            self._compiling[key] = compiling
            compiling.add_done_callback(lambda done: self._forget_compilation(key, done))
        return compiling

    def _forget_compilation(self, key: tuple[str, str], done: asyncio.Future) -> None:
        self._compiling.pop(key, None)
        if not done.cancelled():
            done.exception()  # seen here; each waiting request gets it through its own await

    def shutdown(self) -> None:
        if self._compile_pool is not None:
            self._compile_pool.shutdown(wait=False, cancel_futures=True)

    def use_grammar_cache(self, grammars) -> None:
        """Use a prepared `GrammarCache` (tests with a hand-made vocabulary)."""
        self._grammars = grammars

    def admit(self, requests: Sequence[Request]) -> None:
        """Compile the requests' shared constraint and give each its own matcher."""
        guided = requests[0].sampling_params.guided
        if guided is None:
            return
        import xgrammar as xgr
        check_guided_limits(guided, self.limits)
        compiled = self.grammars.compile(guided)
        for request in requests:
            request.guided_matcher = xgr.GrammarMatcher(compiled)

    def prepare_step(self, scheduled: Sequence[ScheduledRequest], requests: dict[str, Request]) -> dict[str, str]:
        """Set `guided_bitmask` on every sampling row whose request has a matcher; returns the
        rows that failed (request id -> message)."""
        rows = [item for item in scheduled if item.sampling_params is not None
                and requests[item.request_id].guided_matcher is not None]
        failed: dict[str, str] = {}
        masks = run_isolated(rows, lambda items: self._fill_masks(items, requests), failed, "guided decoding")
        for item in rows:
            item.guided_bitmask = masks.get(item.request_id)
        return failed

    def _fill_masks(self, items: Sequence[ScheduledRequest], requests: dict[str, Request]) -> dict:
        matchers = [requests[item.request_id].guided_matcher for item in items]
        bitmask, restricts = fill_bitmask(matchers, self.vocab_size)
        masks = {}
        for index, item in enumerate(items):
            if restricts[index] and allows_no_token(bitmask[index], self.vocab_size):
                raise NoAllowedTokenError("the constraint allows no token at this point")
            masks[item.request_id] = bitmask[index] if restricts[index] else None
        return masks

    def advance(self, requests: Sequence[Request]) -> list[tuple[Request, RequestStatus]]:
        """Feed each unfinished guided request its newest token; returns the requests to
        finish: "stop" once the matcher terminated, "abort" if it refused the token."""
        to_finish = []
        for request in requests:
            matcher = request.guided_matcher
            if matcher is None or request.is_finished:
                continue
            token_id = request.output_token_ids[-1]
            try:
                is_accepted = matcher.accept_token(token_id)
            except Exception as error:  # noqa: BLE001 - this request alone fails
                request.error = f"guided decoding failed: {describe_error(error)}"
                to_finish.append((request, RequestStatus.FINISHED_ERROR))
                continue
            if not is_accepted:
                logger.warning("request %s: token %d breaks its %s constraint; aborting",
                               request.request_id, token_id, request.sampling_params.guided.kind,
                               extra={"request_id": request.request_id})
                to_finish.append((request, RequestStatus.FINISHED_ABORTED))
            elif matcher.is_terminated():
                to_finish.append((request, RequestStatus.FINISHED_STOPPED))
        return to_finish
