"""When each request is sent: a seeded arrival schedule at a mean request rate.

Inter-arrival gaps follow a gamma distribution with shape `burstiness` and mean 1/rate:
burstiness 1 is a Poisson process (exponential gaps), below 1 burstier, above 1 more even.
An infinite rate sends everything at once. Called by runner.run_benchmark.
"""

import math
import random

from shared.errors import ConfigurationError


def arrival_offsets(num_requests: int, request_rate: float, burstiness: float = 1.0,
                    seed: int = 0) -> list[float]:
    """Seconds from the benchmark's start at which each request is sent (non-decreasing)."""
    if not request_rate > 0:
        raise ConfigurationError("request-rate", f"must be > 0 or inf, got {request_rate}")
    if not burstiness > 0:
        raise ConfigurationError("burstiness", f"must be > 0, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    scale = 1.0 / (request_rate * burstiness)
    offsets, now = [], 0.0
    for index in range(num_requests):
        if index > 0:
            now += rng.gammavariate(burstiness, scale)
        offsets.append(now)
    return offsets
