"""Steady open-loop load for the chaos benchmark: greedy gRPC Generate streams arriving as a
Poisson process (seeded), spread over the gateways in turn, each recorded whatever happens.

Every request has random ordinary-token prompt ids (reproducible from its index), asks for
`max_tokens` with EOS ignored and carries the client deadline `timeout_s`. Its outcome is one of:
- ok: finished (stop or length) with as many tokens as its usage says;
- failed: ended with a gRPC status that says what happened (a code other than UNKNOWN with a
  message), before the client's own deadline;
- lost: anything else: a stream that ended without a finish reason or an error, one whose
  token count disagrees with its usage, an UNKNOWN status, or one that hung until the
  client's deadline (DEADLINE_EXCEEDED within a second of it).
"""

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from benchmarks.fault_load import FINISHED, greedy_request, random_prompt, record_stream

OK, FAILED, LOST = "ok", "failed", "lost"


@dataclass
class ChaosResult:
    index: int
    gateway: int
    prompt_ids: list[int]
    max_tokens: int
    started_at: float = 0.0  # monotonic
    ended_at: float = 0.0
    ttft_s: float | None = None
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (arrival, gap since the previous)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: int = 0
    completion_tokens: int = 0
    code: str = ""  # gRPC status code name of a failed stream
    details: str = ""
    retry_after: str = ""  # trailing metadata of a shed request

    def outcome(self, timeout_s: float) -> str:
        if not self.code:
            is_whole = self.finish_reason in FINISHED and self.completion_tokens == len(self.token_ids) > 0
            return OK if is_whole else LOST
        hung = self.code == "DEADLINE_EXCEEDED" and self.ended_at - self.started_at >= timeout_s - 1.0
        return LOST if hung or self.code == "UNKNOWN" or not self.details else FAILED


class PoissonLoad:
    """`load.start()`, then `load.stop_arrivals()`, then `load.results()` waits for every stream."""

    def __init__(self, stubs: list, rate: float, seed: int, prompt_tokens: tuple[int, int] = (64, 256),
                 max_tokens: tuple[int, int] = (16, 64), timeout_s: float = 120.0, max_workers: int = 256):
        self.stubs = stubs
        self.rate = rate
        self.rate_factor = 1.0  # an overload burst raises it for a while
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self._rng = random.Random(seed)
        self._seed = seed
        self._results: list[ChaosResult] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="chaos-load")
        self._arrivals = threading.Thread(target=self._arrive, name="chaos-arrivals", daemon=True)
        self.started_at = 0.0

    def start(self) -> None:
        self.started_at = time.monotonic()
        self._arrivals.start()

    def stop_arrivals(self) -> None:
        self._stop.set()
        self._arrivals.join()

    def results(self) -> list[ChaosResult]:
        self._pool.shutdown(wait=True)
        return list(self._results)

    def arrival_times(self) -> list[float]:
        """When each request started (monotonic), of those started so far."""
        with self._lock:
            return [r.started_at for r in self._results if r.started_at]

    def num_in_flight(self) -> int:
        with self._lock:
            return sum(1 for r in self._results if r.ended_at == 0.0)

    def _arrive(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            next_at += self._rng.expovariate(self.rate * self.rate_factor)
            if self._stop.wait(max(0.0, next_at - time.monotonic())):
                return
            index = len(self._results)
            request_rng = random.Random(self._seed * 1_000_003 + index)
            result = ChaosResult(index, index % len(self.stubs),
                                 random_prompt(request_rng.randint(*self.prompt_tokens), self._seed * 1_000_003 + index),
                                 request_rng.randint(*self.max_tokens))
            with self._lock:
                self._results.append(result)
            self._pool.submit(self._run, result)

    def _run(self, result: ChaosResult) -> None:
        request = greedy_request(result.prompt_ids, result.max_tokens)
        result.started_at = time.monotonic()
        call = self.stubs[result.gateway].Generate(request, timeout=self.timeout_s)
        try:
            record_stream(result, call)
        except grpc.RpcError as error:
            result.code, result.details = error.code().name, error.details() or ""
            result.retry_after = dict(error.trailing_metadata() or ()).get("retry-after", "")
        except Exception as error:  # noqa: BLE001 - recorded as lost, never silently dropped
            result.code, result.details = "UNKNOWN", f"client error: {error!r}"
        finally:
            result.ended_at = time.monotonic()
