"""Load shedding: a request is admitted when its predicted wait for a first token fits.

A request waits for its first token while its prompt is queued or prefilled. Above capacity
that wait grows without bound until the requests' deadlines fire, so every request fails late
instead of a few failing early. The gateway predicts each new request's wait
(services.gateway.wait_prediction: the prompt tokens ahead of it on the best prompt instance,
and its own, at the measured prompt rate) and admits it when the wait is within
`max_queue_wait_s`, or within the time left before the request's deadline when that is less. A
request with nothing ahead of it is always admitted: waiting would not make its own prompt
shorter. Nor is a request refused on a guessed rate: until the gateway's measurements span a
few busy seconds, only a rate the operator gave (--prompt-tokens-per-s, --profile) can refuse
one; a burst at a fresh gateway is admitted, and its first tokens measure the rate for the
requests after it. The prompt instances are the live prefill instances, or the colocated ones
when no prefill instance is live; with none live the request is admitted and routing answers
UNAVAILABLE, which says more.

A request over the limit fails at once with RESOURCE_EXHAUSTED (HTTP 429), a message naming the
prediction and the limit, and a Retry-After of when the queue ahead will have drained enough for
the wait to fit (at the measured rate, if nothing else arrives). It is refused before anything is
reserved, so it leaves nothing behind. An admitted request is never checked again: instances
that leave or join while it waits do not refuse it.

Optionally (`max_queued_per_instance`, off by default) a count limit sheds too: while the
prompts waiting for a first token reach that many per prompt instance, counted both by the
heartbeats and by this gateway's own waiting requests (the larger wins). The per-key limits
(services.gateway.rate_limits) are separate: they share a gateway fairly among keys, this keeps
the pool's queue short for everyone.
"""

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable

import grpc

from shared.cluster.instances import InstanceInfo, InstanceLoad

from services.gateway.errors import GatewayError
from services.gateway.wait_prediction import (
    DEFAULT_PROMPT_TOKENS_PER_S, PromptPool, PromptRate, WaitPrediction, predict_wait,
)

PROMPT_ROLES = ("prefill", "colocated")
WAIT_SETTING = "max_queue_wait_s"
COUNT_SETTING = "max_queued_per_instance"
DEFAULT_MAX_QUEUE_WAIT_S = 120.0
MIN_RETRY_AFTER_S = 1.0
MAX_RETRY_AFTER_S = 600.0
# Shed counts by reason (the metric's label).
PREDICTED_WAIT, QUEUED_COUNT = "predicted_wait", "queued_count"
SHED_REASONS = (PREDICTED_WAIT, QUEUED_COUNT)


def prompt_pool(listing: Iterable[tuple[InstanceInfo, InstanceLoad]]) -> PromptPool:
    """The live instances that compute prompts and their prompts queued or being prefilled by
    their heartbeats: the prefill pool, or the colocated instances when no prefill instance is
    live. A colocated instance's decoding requests are not waiting for a first token."""
    by_role: dict[str, list[InstanceLoad]] = {role: [] for role in PROMPT_ROLES}
    for info, load in listing:
        if info.role in by_role:
            by_role[info.role].append(load)
    waiting = [load.queue_depth + load.num_prefilling for load in by_role["prefill"] or by_role["colocated"]]
    return PromptPool(len(waiting), sum(waiting), min(waiting, default=0))


class Ticket:
    """One admitted request: `first_token()` once its first token arrived (or it ended), then
    `release()` (idempotent) when it ends; both may be called in any order."""

    def __init__(self, admission: "Admission", num_tokens: int):
        self._admission = admission
        self.num_tokens = num_tokens
        self._is_waiting = True

    def first_token(self) -> None:
        if self._is_waiting:
            self._is_waiting = False
            self._admission._done_waiting(self.num_tokens, has_first_token=True)

    def release(self) -> None:
        if self._is_waiting:
            self._is_waiting = False  # ended without a token: its prompt tells nothing of the rate
            self._admission._done_waiting(self.num_tokens, has_first_token=False)


class Admission:
    def __init__(self, max_queue_wait_s: float = DEFAULT_MAX_QUEUE_WAIT_S, max_queued_per_instance: int = 0,
                 prior_tokens_per_s: float = DEFAULT_PROMPT_TOKENS_PER_S,
                 clock: Callable[[], float] = time.monotonic, prior_is_a_guess: bool = False):
        self.max_queue_wait_s = max_queue_wait_s  # 0: never shed on the prediction
        self.max_queued_per_instance = max_queued_per_instance  # 0: no count limit
        self.rate = PromptRate(prior_tokens_per_s, clock, prior_is_a_guess)
        self.num_waiting = 0  # this gateway's admitted requests without a first token yet
        self.num_waiting_tokens = 0  # their prompt tokens
        self.num_shed: Counter = Counter()  # by reason: PREDICTED_WAIT, QUEUED_COUNT
        self.last_prediction: WaitPrediction | None = None
        self._pool = PromptPool(0, 0, 0)

    def admit(self, num_tokens: int, pool: PromptPool, seconds_left: float | None = None) -> Ticket:
        """A ticket for a new request of `num_tokens` prompt tokens, or GatewayError
        RESOURCE_EXHAUSTED (with retry_after_s) when its predicted wait is over the limit (the
        smaller of max_queue_wait_s and `seconds_left`, its deadline) or the count limit is full."""
        self._pool = pool
        if pool.num_instances > 0:
            prediction = predict_wait(num_tokens, pool, self.num_waiting, self.num_waiting_tokens,
                                      self.rate.tokens_per_s())
            self.last_prediction = prediction
            self._check_count(pool, prediction)
            self._check_wait(prediction, seconds_left)
        self.num_waiting += 1
        self.num_waiting_tokens += num_tokens
        self._update_busy()
        return Ticket(self, num_tokens)

    def _check_wait(self, prediction: WaitPrediction, seconds_left: float | None) -> None:
        limits = [(self.max_queue_wait_s, f"the limit of {self.max_queue_wait_s:g} s ({WAIT_SETTING})")]
        if seconds_left is not None:
            limits.append((seconds_left, f"the {seconds_left:.1f} s left before the request's deadline"))
        limit_s, named = min(limits, key=lambda limit: limit[0])
        if (self.max_queue_wait_s <= 0 or not self.rate.is_known or prediction.num_prompts_ahead == 0
                or prediction.wait_s <= limit_s):
            return
        retry_after_s = _bounded_retry_after(prediction.wait_s - limit_s)
        self.num_shed[PREDICTED_WAIT] += 1
        raise GatewayError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"overloaded: the predicted wait for a first token is {prediction.wait_s:.1f} s "
                           f"({prediction.describe()}), over {named}; retry after {math.ceil(retry_after_s)} s",
                           retry_after_s=retry_after_s)

    def _check_count(self, pool: PromptPool, prediction: WaitPrediction) -> None:
        limit = self.max_queued_per_instance * pool.num_instances
        waiting = max(pool.num_waiting, self.num_waiting)
        if self.max_queued_per_instance <= 0 or waiting < limit:
            return
        # Until one more than the excess has drained from the pool, at the predicted pace.
        drain_tokens = (waiting - limit + 1) * prediction.tokens_per_prompt
        retry_after_s = _bounded_retry_after(drain_tokens / (prediction.tokens_per_s * pool.num_instances))
        self.num_shed[QUEUED_COUNT] += 1
        raise GatewayError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"overloaded: {waiting} requests wait for their first token on {pool.num_instances} prompt "
            f"instance(s), the limit is {limit} ({COUNT_SETTING}={self.max_queued_per_instance} per instance); "
            f"retry after {math.ceil(retry_after_s)} s", retry_after_s=retry_after_s)

    def _done_waiting(self, num_tokens: int, has_first_token: bool) -> None:
        if has_first_token:
            self.rate.add_done(num_tokens)
        self.num_waiting -= 1
        self.num_waiting_tokens -= num_tokens
        self._update_busy()

    def _update_busy(self) -> None:
        """The prompt instances busy with this gateway's requests: as many as have any waiting
        (at most all), in this gateway's share of the waiting requests."""
        num_waiting = max(self.num_waiting, self._pool.num_waiting)
        if num_waiting == 0 or self._pool.num_instances == 0:
            self.rate.set_busy(0.0)
            return
        num_busy = min(self._pool.num_instances, num_waiting)
        self.rate.set_busy(num_busy * self.num_waiting / num_waiting)


def _bounded_retry_after(seconds: float) -> float:
    return min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, seconds))
