"""Requests that wait for room on the decode pool, in arrival order.

Every decode instance may refuse a Reserve for want of free KV blocks while a burst fills the
pool. Failing those requests (RESOURCE_EXHAUSTED) would make a client retry what the pool will
serve in seconds, so the request waits here instead, at most --max-room-wait-s (or until its
deadline), then fails RESOURCE_EXHAUSTED saying how long it waited. The queue is first come
first served: a request that arrives while others wait joins the end without trying, and only
the one at the head tries again, when a completion of this gateway ends (it freed blocks) or
every RECHECK_S (other gateways' completions free blocks too). A head that gets its reservation
leaves and lets the next one try at once, so freed room fills as fast as reservations are
granted; a refused head keeps its place. So a full pool costs one refused Reserve per freed
completion, not one per waiting request.
"""

import asyncio
import contextlib
from collections import deque

# Seconds between the head's tries when no completion of this gateway ended meanwhile.
RECHECK_S = 0.5


class Turn:
    """One request's place in the queue: set when it is its turn to try."""

    def __init__(self):
        self.event = asyncio.Event()


class DecodeRoom:
    def __init__(self, recheck_s: float = RECHECK_S):
        self.recheck_s = recheck_s
        self._queue: deque[Turn] = deque()
        self.num_waited = 0  # requests that waited here (a counter)

    @property
    def num_waiting(self) -> int:
        return len(self._queue)

    def join(self) -> Turn:
        """A place at the end of the queue."""
        turn = Turn()
        self._queue.append(turn)
        self.num_waited += 1
        return turn

    async def wait_turn(self, turn: Turn, seconds: float) -> bool:
        """Wait, at most `seconds`, until `turn` may try again: it is at the head and a
        completion ended (or RECHECK_S passed). False if the time ran out first."""
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + seconds
        while True:
            left = ends_at - loop.time()
            if left <= 0:
                return False
            at_head = self._queue and self._queue[0] is turn
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(turn.event.wait(), min(left, self.recheck_s) if at_head else left)
            if turn.event.is_set() or at_head:
                turn.event.clear()
                return True

    def freed(self) -> None:
        """A completion of this gateway ended: the head may try now."""
        if self._queue:
            self._queue[0].event.set()

    def leave(self, turn: Turn) -> None:
        """`turn` got its reservation or gave up: the next in line may try now."""
        was_head = bool(self._queue) and self._queue[0] is turn
        with contextlib.suppress(ValueError):
            self._queue.remove(turn)
        if was_head:
            self.freed()
