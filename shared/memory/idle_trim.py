"""Give freed heap memory back to the kernel when the engine goes idle.

The raised malloc thresholds (shared.model.cpu_runtime) keep freed memory in the process so
busy steps reuse it without page faults; the price is that a burst's peak stays resident
forever. `IdleTrimmer.on_idle()` (called by AsyncEngine when it has nothing to run) calls
malloc_trim(0) when enough is free, at most once every `min_interval_s`: idle memory goes
back, and the first step after idling pays the page faults once.
"""

import logging
import time

from shared.memory.malloc_stats import malloc_stats, release_free_memory

logger = logging.getLogger(__name__)

DEFAULT_MIN_FREE_BYTES = 32 << 20
DEFAULT_MIN_INTERVAL_S = 10.0


class IdleTrimmer:
    def __init__(self, min_free_bytes: int = DEFAULT_MIN_FREE_BYTES, min_interval_s: float = DEFAULT_MIN_INTERVAL_S):
        self.min_free_bytes = min_free_bytes
        self.min_interval_s = min_interval_s
        self.num_trims = 0
        self._last_check = float("-inf")

    def on_idle(self) -> bool:
        """Trim if it is worth it; looks at most once every `min_interval_s`. True if it trimmed."""
        now = time.monotonic()
        if now - self._last_check < self.min_interval_s:
            return False
        self._last_check = now
        stats = malloc_stats()
        if stats is None or stats.free_bytes < self.min_free_bytes:
            return False
        release_free_memory()
        self.num_trims += 1
        logger.debug("idle: returned free heap memory (%.0f MiB were free)", stats.free_bytes / (1 << 20))
        return True
