"""Simulated instances, costed by the profile.

PrefillSim: a FIFO whose engine computes, each step, every queued prompt that fits the step's
token budget (--max-num-batched-tokens) together: the step costs the profile's per-step time
once plus each prompt's per-token and attention time, and all of them finish when it ends.
It remembers which common prefixes it has cached. `busy_until` is when it would be free if
every queued prompt ran alone (what the gateway's choice uses: an upper bound).
DecodeSim: continuous batching. Sequences join at a step boundary and leave when done; a step
lasts decode_step_s(batch, mean context). Its engine answers the gateway's Reserve, notes a
prompt's KV landing, and starts the request (the Decode call that follows that notice) each
at a step boundary, as the engine-core loop does; when idle, at once. Bookkeeping is O(1) per step plus O(1) per
finishing sequence: each sequence's finish step is known when it joins, and the running
context sum follows from the joins."""

import heapq
from array import array
from collections import deque
from dataclasses import dataclass, field

from services.cost_model.perf_profile import PerfProfile
from services.simulator.workload import SimRequest


@dataclass
class Lifetime:
    launched_s: float
    ready_s: float
    stopped_s: float | None = None
    draining: bool = False

    def is_routable(self, now: float) -> bool:
        return not self.draining and self.ready_s <= now and self.stopped_s is None


@dataclass
class PrefillSim:
    name: str
    life: Lifetime
    busy_until: float = 0.0
    outstanding: int = 0  # queued + computing
    cached_prefixes: set[int] = field(default_factory=set)
    queue: deque = field(default_factory=deque)  # (request, new tokens to compute)
    is_busy: bool = False

    def cached_tokens(self, request: SimRequest) -> int:
        return request.prefix_tokens if request.prefix_id in self.cached_prefixes else 0

    def enqueue(self, request: SimRequest, now: float, profile: PerfProfile) -> int:
        """Queue the prompt; returns the tokens it found cached."""
        cached = self.cached_tokens(request)
        cost = profile.prefill_s(request.prompt_tokens, cached)
        self.busy_until = max(now, self.busy_until, self.life.ready_s) + cost
        self.queue.append((request, request.prompt_tokens - cached))
        self.outstanding += 1
        if request.prefix_id is not None:
            self.cached_prefixes.add(request.prefix_id)
        return cached


    def take_batch(self, max_tokens: int) -> tuple[list[SimRequest], list[int]]:
        """The queued prompts one step computes: in order, while they fit `max_tokens` (at least one)."""
        requests, new_tokens = [], []
        while self.queue and (not requests or sum(new_tokens) + self.queue[0][1] <= max_tokens):
            request, tokens = self.queue.popleft()
            requests.append(request)
            new_tokens.append(tokens)
        return requests, new_tokens


@dataclass
class Sequence:
    request: SimRequest
    join_step: int
    finish_step: int


class DecodeSim:
    def __init__(self, name: str, life: Lifetime, profile: PerfProfile, max_batch: int):
        self.name = name
        self.life = life
        self.profile = profile
        self.max_batch = max_batch
        self.step = 0
        self.running: dict[int, Sequence] = {}
        self.finishing: list[tuple[int, int]] = []  # (finish step, request id)
        self.reserving: list[SimRequest] = []  # Reserve calls, answered at the next boundary
        self.landed: list[SimRequest] = []  # KV landed, noted at the next boundary
        self.waiting: list[SimRequest] = []  # noted; started (first token) at the next boundary
        self.num_pending = 0  # reserved, not yet started
        self.pending_tokens = 0
        self.kv_reserved = 0
        self.sum_prompt = 0
        self.sum_join = 0
        self.is_stepping = False
        self.step_started = 0.0
        self.step_durations = array("d")
        self.step_batches = array("i")

    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def free_kv(self) -> int:
        return self.profile.kv_capacity_tokens - self.kv_reserved

    def reserve(self, request: SimRequest) -> None:
        self.num_pending += 1
        self.pending_tokens += request.prompt_tokens + request.output_tokens

    def preference(self) -> tuple[int, int]:
        """The gateway reserves on the decode instance with the most free KV, then the least load."""
        return self.free_kv() - self.pending_tokens, -(self.load() + self.num_pending)

    def _fits(self, request: SimRequest) -> bool:
        needed = request.prompt_tokens + request.output_tokens
        return len(self.running) < self.max_batch and needed <= self.free_kv()

    def admit_waiting(self) -> list[SimRequest]:
        """Start the waiting requests that fit, in order; returns them (the decode engine
        admits a request between steps and streams its first token then)."""
        admitted = []
        while self.waiting and (self._fits(self.waiting[0]) or not self.running):
            request = self.waiting.pop(0)
            admitted.append(request)
            self.num_pending -= 1
            self.pending_tokens -= request.prompt_tokens + request.output_tokens
            finish = self.step + max(0, request.output_tokens - 1)
            self.running[request.request_id] = Sequence(request, self.step, finish)
            heapq.heappush(self.finishing, (finish, request.request_id))
            self.kv_reserved += request.prompt_tokens + request.output_tokens
            self.sum_prompt += request.prompt_tokens
            self.sum_join += self.step
        return admitted

    def next_step_s(self) -> float:
        batch = len(self.running)
        context = (self.sum_prompt + batch * self.step - self.sum_join) / batch
        return self.profile.decode_step_s(batch, context)

    def end_step(self, duration_s: float) -> list[Sequence]:
        """Close the step that just ended; returns the sequences that finished."""
        self.step_durations.append(duration_s)
        self.step_batches.append(len(self.running))
        self.step += 1
        return self.pop_finished()

    def pop_finished(self) -> list[Sequence]:
        done = []
        while self.finishing and self.finishing[0][0] <= self.step:
            _, request_id = heapq.heappop(self.finishing)
            sequence = self.running.pop(request_id)
            self.kv_reserved -= sequence.request.prompt_tokens + sequence.request.output_tokens
            self.sum_prompt -= sequence.request.prompt_tokens
            self.sum_join -= sequence.join_step
            done.append(sequence)
        return done
