"""The predicted wait for a first token: the prompt tokens queued ahead of a new request on the
best prompt instance, plus its own, at the rate a prompt instance was measured to compute them.

PromptRate measures that rate from what the gateway sees: a request's prompt tokens are done
when its first token arrives; the prompt instances were busy meanwhile, as many of them as had
requests waiting (at most all of them), in the share of the waiting requests that are this
gateway's (the heartbeats count the other gateways' too). Prompt tokens done per busy
instance-second is the rate. A prefix-cache hit makes a prompt cheap; the rate counts every
prompt token, so it is the rate of prompts like the recent ones. Until measurements come, a prior
stands for PRIOR_WEIGHT_S of them: a rate the operator gave (--prompt-tokens-per-s) or a
`pdserve profile` measured, or else DEFAULT_PROMPT_TOKENS_PER_S, a guess, on which admission
refuses nothing (`is_known`) and which the measurements replace once they span
GUESS_REPLACED_AFTER_S busy instance-seconds (the first few first tokens of a burst come while
the gateway itself is busiest taking the burst in: in a burst of 512 chats on an AMX Xeon they
measured 400 prompt tokens/s of a prefill instance that computes several thousand). Older
measurements, the prior's first, fade once WINDOW_S instance-seconds are counted, so the rate
follows the load.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from services.cost_model.perf_profile import PerfProfile

# About what docs/autoscaling/profile-smollm2-cpu-fp32.json measured for 256-token prompts.
DEFAULT_PROMPT_TOKENS_PER_S = 500.0
PRIOR_WEIGHT_S = 2.0
GUESS_REPLACED_AFTER_S = 5.0
WINDOW_S = 30.0
MIN_PROMPT_TOKENS_PER_S = 1.0  # a stalled pool: waits become long, never infinite
PROFILE_PROMPT_TOKENS = 256


def profile_prompt_rate(profile: PerfProfile) -> float:
    """Prompt tokens per second of one instance by a `pdserve profile` (256-token prompts)."""
    return PROFILE_PROMPT_TOKENS / profile.prefill_s(PROFILE_PROMPT_TOKENS)


class PromptRate:
    """Prompt tokens per second per busy prompt instance, measured (see the module docstring)."""

    def __init__(self, prior_tokens_per_s: float = DEFAULT_PROMPT_TOKENS_PER_S,
                 clock: Callable[[], float] = time.monotonic, prior_is_a_guess: bool = False):
        self.prior_tokens_per_s = prior_tokens_per_s
        self.clock = clock
        self.is_known = not prior_is_a_guess  # a given prior, or GUESS_REPLACED_AFTER_S measured
        # Measured prompt tokens and busy instance-seconds, and the seconds the prior stands
        # for, faded alike.
        self._num_tokens = 0.0
        self._busy_s = 0.0
        self._prior_s = PRIOR_WEIGHT_S
        self._num_busy = 0.0  # instances busy with this gateway's requests now
        self._since = clock()

    def set_busy(self, num_busy_instances: float) -> None:
        """From now on, this many instances compute this gateway's prompts."""
        self._count_busy_time()
        self._num_busy = num_busy_instances

    def add_done(self, num_tokens: int) -> None:
        """A request's first token came: its prompt tokens are done."""
        self._count_busy_time()
        self._num_tokens += num_tokens
        if not self.is_known and self._busy_s >= GUESS_REPLACED_AFTER_S:
            self.is_known, self._prior_s = True, 0.0  # the guess gives way to the measurements
        total_s = self._busy_s + self._prior_s
        if total_s > WINDOW_S:
            fade = WINDOW_S / total_s
            self._num_tokens *= fade
            self._busy_s *= fade
            self._prior_s *= fade

    def tokens_per_s(self) -> float:
        """The measured rate, the busy time so far counted (a stalled pool slows it down)."""
        self._count_busy_time()
        num_tokens = self._num_tokens + self.prior_tokens_per_s * self._prior_s
        # Never zero: the prior's seconds only fade, and the guess goes once measurements span
        # GUESS_REPLACED_AFTER_S.
        total_s = self._busy_s + self._prior_s
        return max(MIN_PROMPT_TOKENS_PER_S, num_tokens / total_s)

    def _count_busy_time(self) -> None:
        now = self.clock()
        self._busy_s += (now - self._since) * self._num_busy
        self._since = now


@dataclass(frozen=True)
class PromptPool:
    """The live instances that compute prompts, by their last heartbeats."""

    num_instances: int
    num_waiting: int  # prompts queued or being prefilled on them all
    fewest_waiting: int  # on the least loaded one


@dataclass(frozen=True)
class WaitPrediction:
    num_prompts_ahead: int  # on the best instance
    tokens_per_prompt: float  # of the prompts ahead
    num_instances: int
    tokens_per_s: float  # per instance
    wait_s: float  # for the queue ahead and the request's own prompt

    @property
    def num_tokens_ahead(self) -> float:
        return self.num_prompts_ahead * self.tokens_per_prompt

    def describe(self) -> str:
        return (f"{self.num_prompts_ahead} prompt(s), about {round(self.num_tokens_ahead)} tokens ahead on the best "
                f"of {self.num_instances} prompt instance(s) at {self.tokens_per_s:.0f} prompt tokens/s each")


def predict_wait(num_tokens: int, pool: PromptPool, num_local_waiting: int, num_local_tokens: int,
                 tokens_per_s: float) -> WaitPrediction:
    """The wait of a new request of `num_tokens` prompt tokens. Ahead of it on the best instance:
    its share of this gateway's waiting requests (routing spreads them by load), or what that
    instance's heartbeat shows when more (other gateways' requests); each as long as this
    gateway's waiting prompts on average (else as the new one)."""
    num_instances = max(1, pool.num_instances)
    num_ahead = max(num_local_waiting // num_instances, pool.fewest_waiting)
    tokens_per_prompt = num_local_tokens / num_local_waiting if num_local_waiting else num_tokens
    return WaitPrediction(num_ahead, tokens_per_prompt, pool.num_instances, tokens_per_s,
                          (num_ahead * tokens_per_prompt + num_tokens) / tokens_per_s)
