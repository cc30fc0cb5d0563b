"""A request's deadline, from which every downstream call takes its timeout."""

import time
from collections.abc import Callable

import grpc

from services.gateway.errors import GatewayError


class Deadline:
    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.expires_at = clock() + seconds

    def remaining(self, cap_s: float | None = None) -> float:
        """Seconds left (at most cap_s); DEADLINE_EXCEEDED once none are."""
        left = self.seconds_left()
        if left <= 0:
            raise GatewayError(grpc.StatusCode.DEADLINE_EXCEEDED, "the request's deadline passed")
        return left if cap_s is None else min(left, cap_s)

    def seconds_left(self) -> float:
        """Seconds left; zero or less once it passed."""
        return self.expires_at - self.clock()

    def has_passed(self) -> bool:
        return self.clock() >= self.expires_at


def client_deadline(time_remaining: float | None, default_s: float) -> Deadline:
    """The client's remaining time (grpc `context.time_remaining()`), else the default."""
    if time_remaining is None:
        return Deadline(default_s)
    return Deadline(time_remaining)
