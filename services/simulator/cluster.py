"""ClusterSim: a discrete-event simulation of a P/D cluster. Requests arrive, the gateway
reserves on the decode instance with the most free KV (answered at that instance's next step
boundary), routes the prompt to the prefill instance that finishes it first (its backlog plus
the prompt's cost there, so a cached prefix counts), the KV moves to the decode instance (in
the profiled transfer time), decode instances batch continuously (the engine notes the KV at
one step boundary and starts the request, streaming its first token, at the next), and a
scaler resizes both pools every interval (new instances serve after `startup_s`; removed ones
drain first).

Instances run on machines of their own, or (`host_cores` set) all on one shared host whose
cores they split (services.simulator.host): then every prefill and decode step is a job on
that host and its end moves whenever another job starts or ends.

Events are plain tuples (time, order, kind, subject, detail) on one heap."""

import heapq
import itertools
import random
from dataclasses import dataclass

from services.cost_model.perf_profile import PerfProfile
from services.simulator.host import SharedHost
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
    # The KV transfer when the profile has no transfer points: latency + bytes / bandwidth.
    kv_bytes_per_token: int = 23_040  # SmolLM2 bf16: 30 layers x 2 x 3 KV heads x 64 x 2 bytes
    kv_bandwidth_bytes_s: float = 1.0e9
    kv_transfer_latency_s: float = 0.002
    startup_s: float = 30.0
    max_batch: int = 128
    max_prefill_batch_tokens: int = 2048  # an instance's --max-num-batched-tokens
    interval_s: float = 10.0
    # None: every instance on a machine of its own; else all share one host of this many cores.
    host_cores: int | None = None
    colocated_slowdown: float = 1.0  # see services.simulator.host


class ClusterSim:
    def __init__(self, profile: PerfProfile, config: SimConfig, scaler, num_prefill: int, num_decode: int):
        self.profile = profile
        self.config = config
        self.scaler = scaler
        self.prefill: list[PrefillSim] = []
        self.decode: list[DecodeSim] = []
        self.recorder = Recorder(config.ttft_slo_s, config.itl_slo_s)
        self.router = PrefillRouter()
        self.host = None if config.host_cores is None else SharedHost(config.host_cores, config.colocated_slowdown)
        self._jobs: dict[int, tuple] = {}  # shared host: job id -> (kind, subject, detail)
        self._rng = random.Random(0)
        self._events: list[tuple] = []
        self._order = itertools.count()
        self._names = itertools.count()
        self._routable_decode: list[DecodeSim] | None = None
        self._routable_until = 0.0
        self._decode_of: dict[int, DecodeSim] = {}  # request id -> the decode instance it reserved on
        self.now = 0.0
        self.resize("prefill", num_prefill, startup_s=0.0)
        self.resize("decode", num_decode, startup_s=0.0)

    def schedule(self, at: float, kind: str, subject=None, detail=None) -> None:
        heapq.heappush(self._events, (at, next(self._order), kind, subject, detail))

    def run(self, requests: list[SimRequest]) -> Recorder:
        for request in requests:
            self.schedule(request.arrival_s, "arrive", request)
        self.schedule(self.config.interval_s, "plan")
        handlers = {"arrive": self._arrive, "prefilled": self._prefilled, "kv_arrived": self._kv_arrived,
                    "step_end": self._step_end, "plan": self._plan, "job_done": self._job_done,
                    "prefill_wake": self._prefill_wake, "decode_wake": self._decode_wake}
        self._handlers = handlers
        events, pop = self._events, heapq.heappop
        while events:
            at, _, kind, subject, detail = pop(events)
            self.now = at
            handlers[kind](subject, detail)
        self.recorder.close(self.now, self.prefill + self.decode)
        return self.recorder

    # ---- computing: on a machine of its own, or a job on the shared host -------------------

    def _compute(self, work_s: float, kind: str, subject, detail=None) -> None:
        if self.host is None:
            self.schedule(self.now + work_s, kind, subject, detail)
            return
        job_id = next(self._order)
        self._jobs[job_id] = (kind, subject, detail)
        for moved_id, at, version in self.host.start(self.now, job_id, work_s):
            self.schedule(at, "job_done", moved_id, version)

    def _job_done(self, job_id: int, version: int) -> None:
        if not self.host.is_current(job_id, version):
            return  # a finish time that has moved since
        kind, subject, detail = self._jobs.pop(job_id)
        for moved_id, at, moved_version in self.host.finish(self.now, job_id):
            self.schedule(at, "job_done", moved_id, moved_version)
        self._handlers[kind](subject, detail)

    # ---- request path ----------------------------------------------------------------------

    def _arrive(self, request: SimRequest, _) -> None:
        self.recorder.on_arrival(request)
        candidates = self._decode_candidates()
        if len(candidates) > EXACT_DECODE_CHOICE:  # large pools: the best of a few random ones
            candidates = self._rng.sample(candidates, DECODE_CHOICES)
        decode = max(candidates, key=DecodeSim.preference)
        decode.reserve(request)
        self._decode_of[request.request_id] = decode
        if decode.is_stepping:
            decode.reserving.append(request)
        else:
            self._reserved(request)

    def _reserved(self, request: SimRequest) -> None:
        """Its decode instance answered the Reserve: the prompt goes to a prefill instance."""
        target = self.router.choose(request.prefix_id, lambda p: max(p.busy_until, p.life.ready_s, self.now)
                                    + self.profile.prefill_s(request.prompt_tokens, p.cached_tokens(request)))
        is_new_prefix = request.prefix_id is not None and request.prefix_id not in target.cached_prefixes
        self.recorder.on_routed(request, target.enqueue(request, self.now, self.profile))
        if is_new_prefix:
            self.router.on_cached(target, request.prefix_id)
        self._start_prefill(target)

    def _start_prefill(self, instance: PrefillSim) -> None:
        if instance.is_busy or not instance.queue:
            return
        if self.now < instance.life.ready_s:
            instance.is_busy = True  # until it is ready
            self.schedule(instance.life.ready_s, "prefill_wake", instance)
            return
        requests, new_tokens = instance.take_batch(self.config.max_prefill_batch_tokens)
        instance.is_busy = True
        self._compute(self.profile.prefill_batch_s(new_tokens), "prefilled", requests, instance)

    def _prefill_wake(self, instance: PrefillSim, _) -> None:
        instance.is_busy = False
        self._start_prefill(instance)

    def transfer_s(self, request: SimRequest) -> float:
        profiled = self.profile.kv_transfer_s(request.prompt_tokens)
        if profiled is not None:
            return profiled
        config = self.config
        num_bytes = request.prompt_tokens * config.kv_bytes_per_token
        return config.kv_transfer_latency_s + num_bytes / config.kv_bandwidth_bytes_s

    def _prefilled(self, requests: list[SimRequest], instance: PrefillSim) -> None:
        instance.outstanding -= len(requests)
        instance.is_busy = False
        if instance.life.draining and instance.outstanding == 0:
            instance.life.stopped_s = self.now
        self._start_prefill(instance)
        for request in requests:
            handoff_s = self.transfer_s(request) + self.profile.request_overhead_s
            self.schedule(self.now + handoff_s, "kv_arrived", request)

    def _decode_candidates(self) -> list[DecodeSim]:
        """Routable decode instances (cached until the pool changes or one becomes ready);
        if none, the live ones still starting."""
        if self._routable_decode is None or self.now >= self._routable_until:
            self._routable_decode = [d for d in self.decode if d.life.is_routable(self.now)]
            starting = [d.life.ready_s for d in self.decode if not d.life.draining and d.life.stopped_s is None
                         and d.life.ready_s > self.now]
            self._routable_until = min(starting, default=float("inf"))
        return self._routable_decode or [d for d in self.decode if not d.life.draining and d.life.stopped_s is None]

    def _kv_arrived(self, request: SimRequest, _) -> None:
        target = self._decode_of.pop(request.request_id)
        target.landed.append(request)
        if not target.is_stepping:  # the step starts once every arrival of this instant is in
            target.is_stepping = True
            self.schedule(self.now, "decode_wake", target)

    def _start_step(self, instance: DecodeSim) -> None:
        if self.now < instance.life.ready_s:
            instance.is_stepping = True  # until it is ready
            self.schedule(instance.life.ready_s, "decode_wake", instance)
            return
        reserving, instance.reserving = instance.reserving, []
        for request in reserving:
            self._reserved(request)
        started = instance.admit_waiting()  # noted at the last boundary: started now
        instance.waiting += instance.landed  # noted now: started at the next boundary ...
        instance.landed = []
        if not instance.running:  # ... or at once by an idle engine
            started += instance.admit_waiting()
        for request in started:  # its first token streams now, between steps
            self.recorder.on_first_token(request, self.now)
        if not instance.running:
            instance.is_stepping = False
            if instance.life.draining:
                instance.life.stopped_s = self.now
            return
        instance.is_stepping = True
        instance.step_started = self.now
        self._compute(instance.next_step_s(), "step_end", instance)

    def _decode_wake(self, instance: DecodeSim, _) -> None:
        self._start_step(instance)

    def _step_end(self, instance: DecodeSim, _) -> None:
        for sequence in instance.end_step(self.now - instance.step_started):
            self.recorder.on_done(sequence.request, self.now)
        self._start_step(instance)

    # ---- scaling ---------------------------------------------------------------------------

    def _plan(self, *_) -> None:
        num_prefill, num_decode = self.scaler.decide(self, self.now)
        for role, replicas in (("prefill", num_prefill), ("decode", num_decode)):
            if replicas != self.pool_size(role):
                self.recorder.scale_events += 1
                self.resize(role, replicas, self.config.startup_s)
        self.recorder.on_interval(self.now, self.pool_size("prefill"), self.pool_size("decode"))
        if any(event[2] != "plan" for event in self._events):
            self.schedule(self.now + self.config.interval_s, "plan")

    def pool(self, role: str) -> list:
        return self.prefill if role == "prefill" else self.decode

    def pool_size(self, role: str) -> int:
        return sum(1 for i in self.pool(role) if not i.life.draining and i.life.stopped_s is None)

    def resize(self, role: str, replicas: int, startup_s: float) -> None:
        self._routable_decode = None
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
