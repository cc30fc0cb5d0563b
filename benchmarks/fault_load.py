"""Streaming load for `make bench-faults` and the fault e2e tests: a fixed number of greedy
gRPC Generate streams (random-token prompts, EOS ignored) at a fixed concurrency, each recorded
(ok or the error, tokens, usage, time to first token, when each token arrived), so a fault can
be injected mid-load and nothing may fail."""

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from shared.pb.pdserve.v1 import gateway_pb2, generation_pb2

FINISHED = (generation_pb2.FINISH_REASON_STOP, generation_pb2.FINISH_REASON_LENGTH)


def random_prompt(num_tokens: int, seed: int) -> list[int]:
    """Ordinary (non-special) SmolLM2 token ids, reproducible per seed."""
    rng = random.Random(seed)
    return [rng.randrange(1000, 40000) for _ in range(num_tokens)]


def greedy_request(token_ids: list[int], max_tokens: int) -> gateway_pb2.GenerateRequest:
    sampling = generation_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return gateway_pb2.GenerateRequest(token_ids=gateway_pb2.TokenIds(ids=token_ids), sampling=sampling)


@dataclass
class StreamResult:
    index: int
    token_ids: list[int] = field(default_factory=list)
    error: str | None = None
    finish_reason: int = 0
    completion_tokens: int = 0
    started_at: float = 0.0
    ended_at: float = 0.0
    ttft_s: float | None = None
    # (arrival time, gap since the previous message) of every token-carrying message after the first.
    gaps: list[tuple[float, float]] = field(default_factory=list)

    @property
    def is_ok(self) -> bool:
        return (self.error is None and self.finish_reason in FINISHED
                and self.completion_tokens == len(self.token_ids))


class StreamingLoad:
    """`with StreamingLoad(stub, ...) as load: load.wait_in_flight(2); <fault>; ...` then
    `load.results()` once every stream has ended."""

    def __init__(self, stub, num_requests: int, concurrency: int, prompt_tokens: int | tuple[int, int] = 120,
                 max_tokens: int = 24, seed: int = 0, timeout_s: float = 180.0):
        self.stub = stub
        self.num_requests = num_requests
        # One length, or (low, high): each request's length drawn from that range.
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.seed = seed
        self.timeout_s = timeout_s
        self._results = [StreamResult(index) for index in range(num_requests)]
        self._in_flight = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="load")
        self._futures = []

    def __enter__(self) -> "StreamingLoad":
        self._futures = [self._pool.submit(self._run, result) for result in self._results]
        return self

    def __exit__(self, *exc_info) -> None:
        self._pool.shutdown(wait=True)

    def prompt_of(self, index: int) -> list[int]:
        seed = self.seed * 1000 + index
        length = self.prompt_tokens
        if isinstance(length, tuple):
            length = random.Random(-seed).randint(*length)
        return random_prompt(length, seed)

    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def wait_in_flight(self, count: int, timeout_s: float = 120.0) -> None:
        """Until `count` streams have produced a first token and are still running."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                streaming = sum(1 for r in self._results if r.ttft_s is not None and not r.finish_reason
                                and r.error is None)
            if streaming >= count:
                return
            time.sleep(0.02)
        raise AssertionError(f"fewer than {count} streams were running after {timeout_s} s")

    def results(self) -> list[StreamResult]:
        for future in self._futures:
            future.result(timeout=self.timeout_s)
        return self._results

    def _run(self, result: StreamResult) -> None:
        request = greedy_request(self.prompt_of(result.index), self.max_tokens)
        with self._lock:
            self._in_flight += 1
        result.started_at = time.monotonic()
        try:
            record_stream(result, self.stub.Generate(request, timeout=self.timeout_s))
        except grpc.RpcError as error:
            result.error = f"{error.code().name}: {error.details()}"
        finally:
            result.ended_at = time.monotonic()
            with self._lock:
                self._in_flight -= 1


def failures(results: list[StreamResult]) -> list[str]:
    """One line per stream that did not complete cleanly (empty when all did)."""
    return [f"#{r.index}: {r.error or 'finish ' + str(r.finish_reason)} after {len(r.token_ids)} tokens "
            f"(usage {r.completion_tokens})" for r in results if not r.is_ok]


def record_stream(result, messages) -> None:
    """Read a Generate stream into `result` (a StreamResult or ChaosResult, `started_at` set):
    its tokens, finish reason and usage, the time to its first message and each later gap
    between token messages (when the gap ended, its length)."""
    last = result.started_at
    for message in messages:
        now = time.monotonic()
        if result.ttft_s is None:
            result.ttft_s = now - result.started_at
        elif message.token_ids:
            result.gaps.append((now, now - last))
        last = now
        result.token_ids.extend(message.token_ids)
        result.finish_reason = message.finish_reason or result.finish_reason
        if message.HasField("usage"):
            result.completion_tokens = message.usage.completion_tokens
