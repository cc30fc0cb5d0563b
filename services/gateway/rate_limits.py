"""Per-key request limits: a token bucket of requests per second (with a burst) and a cap
on concurrent requests. `admit(key_id)` returns None when a request may start (then
`release(key_id)` once it ends) or the seconds after which a retry could pass.

Requests without a key (the gateway has none configured) share the key id "anonymous".
The clock is injectable, so tests need no sleeps.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    updated: float
    num_running: int = 0
    # What the key's requests met so far (the gateway's per-key metrics).
    num_admitted: int = 0
    num_over_rate: int = 0
    num_over_concurrency: int = 0


@dataclass(frozen=True)
class KeyStats:
    key_id: str
    num_admitted: int
    num_over_rate: int
    num_over_concurrency: int
    num_running: int


class KeyRateLimiter:
    def __init__(self, requests_per_s: float = 0.0, burst: int = 0, max_concurrent: int = 0,
                 clock: Callable[[], float] = time.monotonic):
        self.requests_per_s = requests_per_s  # 0: no rate limit
        self.burst = burst or max(1, math.ceil(requests_per_s))
        self.max_concurrent = max_concurrent  # 0: no cap
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    @property
    def is_enabled(self) -> bool:
        return self.requests_per_s > 0 or self.max_concurrent > 0

    def admit(self, key_id: str) -> float | None:
        """None: admitted (call `release` when done); else the seconds to wait before retrying."""
        bucket = self._bucket(key_id)
        if self.max_concurrent and bucket.num_running >= self.max_concurrent:
            bucket.num_over_concurrency += 1
            return 1.0
        if self.requests_per_s > 0:
            if bucket.tokens < 1.0:
                bucket.num_over_rate += 1
                return (1.0 - bucket.tokens) / self.requests_per_s
            bucket.tokens -= 1.0
        bucket.num_running += 1
        bucket.num_admitted += 1
        return None

    def stats(self) -> list[KeyStats]:
        """Per key id that has sent requests (configured keys and "anonymous": a bounded set)."""
        return [KeyStats(key_id, b.num_admitted, b.num_over_rate, b.num_over_concurrency, b.num_running)
                for key_id, b in sorted(self._buckets.items())]

    def release(self, key_id: str) -> None:
        bucket = self._buckets.get(key_id)
        if bucket is not None and bucket.num_running > 0:
            bucket.num_running -= 1

    def _bucket(self, key_id: str) -> _Bucket:
        now = self._clock()
        bucket = self._buckets.get(key_id)
        if bucket is None:
            bucket = self._buckets[key_id] = _Bucket(tokens=float(self.burst), updated=now)
        elapsed = max(0.0, now - bucket.updated)
        bucket.tokens = min(float(self.burst), bucket.tokens + elapsed * self.requests_per_s)
        bucket.updated = now
        return bucket


def retry_after_header(seconds: float) -> str:
    """Retry-After takes whole seconds; never 0 for a refused request."""
    return str(max(1, math.ceil(seconds)))
