"""Bounded restarts of a crashed engine core.

After the core process dies, the instance restarts it (the model is loaded again) unless it
has already restarted `max_restarts` times within `window_s`: a core that keeps crashing is a
crash loop, and the instance then exits non-zero so that its supervisor takes over.
"""

import time
from collections import deque


class RestartBudget:
    def __init__(self, max_restarts: int, window_s: float, clock=time.monotonic):
        self.max_restarts = max_restarts
        self.window_s = window_s
        self._clock = clock
        self._restarts: deque[float] = deque()

    def try_take(self) -> bool:
        """Count one restart and return True, or False when the budget is spent."""
        now = self._clock()
        while self._restarts and now - self._restarts[0] > self.window_s:
            self._restarts.popleft()
        if len(self._restarts) >= self.max_restarts:
            return False
        self._restarts.append(now)
        return True

    @property
    def num_recent(self) -> int:
        return len(self._restarts)
