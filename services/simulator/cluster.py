"""ClusterSim: a discrete-event simulation of a P/D cluster. Requests arrive, the gateway
routes each prompt to the prefill instance that finishes it first (its backlog plus the
prompt's cost there, so a cached prefix counts), the KV moves to the decode instance with
the most free KV, decode instances batch continuously, and a scaler resizes both pools every
interval (new instances serve after `startup_s`; removed ones drain first). Live instance
lists are rebuilt per KV arrival: fine for hundreds of instances."""

import heapq
import itertools
import random
from dataclasses import dataclass, field

from services.planner.profile_data import PerfProfile
from services.simulator.instances import DecodeSim, Lifetime, PrefillSim
from services.simulator.prefill_router import PrefillRouter
from services.simulator.recorder import Recorder
from services.simulator.workload import SimRequest

# Decode pools above this size pick the best of DECODE_CHOICES random instances (power of d
# choices) instead of scanning all of them for every request.
EXACT_DECODE_CHOICE = 32
DECODE_CHOICES = 8


@dataclass(frozen=True)
class SimConfig:
    ttft_slo_s: float = 2.0
    itl_slo_s: float = 0.2
    kv_bytes_per_token: int = 23_040  # SmolLM2 bf16: 30 layers x 2 x 3 KV heads x 64 x 2 bytes
    kv_bandwidth_bytes_s: float = 1.0e9
    kv_transfer_latency_s: float = 0.002
    startup_s: float = 30.0
    max_batch: int = 128
    interval_s: float = 10.0


@dataclass(order=True)
class Event:
    at: float
    order: int
    kind: str = field(compare=False)
    subject: object = field(compare=False, default=None)
    detail: object = field(compare=False, default=None)


class ClusterSim:
    def __init__(self, profile: PerfProfile, config: SimConfig, scaler, num_prefill: int, num_decode: int):
        self.profile = profile
        self.config = config
        self.scaler = scaler
        self.prefill: list[PrefillSim] = []
        self.decode: list[DecodeSim] = []
        self.recorder = Recorder(config.ttft_slo_s, config.itl_slo_s)
        self.router = PrefillRouter()
        self._rng = random.Random(0)
        self._events: list[Event] = []
        self._order = itertools.count()
        self._names = itertools.count()
        self.now = 0.0
        self.resize("prefill", num_prefill, startup_s=0.0)
        self.resize("decode", num_decode, startup_s=0.0)

    def schedule(self, at: float, kind: str, subject=None, detail=None) -> None:
        heapq.heappush(self._events, Event(at, next(self._order), kind, subject, detail))

    def run(self, requests: list[SimRequest]) -> Recorder:
        for request in requests:
            self.schedule(request.arrival_s, "arrive", request)
        self.schedule(self.config.interval_s, "plan")
        handlers = {"arrive": self._arrive, "prefilled": self._prefilled, "kv_arrived": self._kv_arrived,
                    "step_end": self._step_end, "plan": self._plan}
        while self._events:
            event = heapq.heappop(self._events)
            self.now = event.at
            handlers[event.kind](event)
        self.recorder.close(self.now, self.prefill + self.decode)
        return self.recorder

    # ---- request path ----------------------------------------------------------------------

    def _arrive(self, event: Event) -> None:
        request: SimRequest = event.subject
        self.recorder.on_arrival(request)
        target = self.router.choose(request.prefix_id, lambda p: max(p.busy_until, p.life.ready_s, self.now)
                                    + self.profile.prefill_s(request.prompt_tokens, p.cached_tokens(request)))
        target.busy_until = max(target.busy_until, target.life.ready_s)
        is_new_prefix = request.prefix_id is not None and request.prefix_id not in target.cached_prefixes
        done_at, _ = target.enqueue(request, self.now, self.profile)
        if is_new_prefix:
            self.router.on_cached(target, request.prefix_id)
        self.schedule(done_at, "prefilled", request, target)

    def _prefilled(self, event: Event) -> None:
        request, instance = event.subject, event.detail
        instance.outstanding -= 1
        if instance.life.draining and instance.outstanding == 0:
            instance.life.stopped_s = self.now
        transfer_s = (self.config.kv_transfer_latency_s
                      + request.prompt_tokens * self.config.kv_bytes_per_token / self.config.kv_bandwidth_bytes_s)
        self.recorder.on_first_token(request, self.now + transfer_s)
        self.schedule(self.now + transfer_s, "kv_arrived", request)

    def _kv_arrived(self, event: Event) -> None:
        ready = [d for d in self.decode if d.life.is_routable(self.now)]
        candidates = ready or [d for d in self.decode if not d.life.draining and d.life.stopped_s is None]
        if len(candidates) > EXACT_DECODE_CHOICE:  # large pools: the best of a few random ones
            candidates = self._rng.sample(candidates, DECODE_CHOICES)
        target = max(candidates, key=lambda d: (d.free_kv() - 1_000_000 * len(d.waiting), -d.load()))
        target.waiting.append(event.subject)
        if not target.is_stepping:
            self._start_step(target)

    def _start_step(self, instance: DecodeSim) -> None:
        instance.admit_waiting()
        if not instance.running:
            instance.is_stepping = False
            if instance.life.draining:
                instance.life.stopped_s = self.now
            return
        instance.is_stepping = True
        duration = instance.next_step_s()
        self.schedule(max(self.now, instance.life.ready_s) + duration, "step_end", instance, duration)

    def _step_end(self, event: Event) -> None:
        instance: DecodeSim = event.subject
        for sequence in instance.end_step(event.detail):
            self.recorder.on_done(sequence.request, self.now)
        self._start_step(instance)

    # ---- scaling ---------------------------------------------------------------------------

    def _plan(self, event: Event) -> None:
        num_prefill, num_decode = self.scaler.decide(self, self.now)
        for role, replicas in (("prefill", num_prefill), ("decode", num_decode)):
            if replicas != self.pool_size(role):
                self.recorder.scale_events += 1
                self.resize(role, replicas, self.config.startup_s)
        self.recorder.on_interval(self.now, self.pool_size("prefill"), self.pool_size("decode"))
        if any(e.kind != "plan" for e in self._events):
            self.schedule(self.now + self.config.interval_s, "plan")

    def pool(self, role: str) -> list:
        return self.prefill if role == "prefill" else self.decode

    def pool_size(self, role: str) -> int:
        return sum(1 for i in self.pool(role) if not i.life.draining and i.life.stopped_s is None)

    def resize(self, role: str, replicas: int, startup_s: float) -> None:
        current = self.pool_size(role)
        for _ in range(replicas - current):
            life = Lifetime(self.now, self.now + startup_s)
            name = f"{role}-{next(self._names)}"
            if role == "prefill":
                instance = PrefillSim(name, life)
                self.router.add(instance)
            else:
                instance = DecodeSim(name, life, self.profile, self.config.max_batch)
            self.pool(role).append(instance)
        if replicas < current:
            active = [i for i in self.pool(role) if not i.life.draining and i.life.stopped_s is None]
            for instance in active[replicas:]:
                self._drain(instance)

    def _drain(self, instance) -> None:
        instance.life.draining = True
        idle = instance.outstanding == 0 if isinstance(instance, PrefillSim) else not instance.is_stepping
        if idle:
            instance.life.stopped_s = self.now
