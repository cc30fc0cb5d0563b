"""The gateway's prefill choice in the simulator: the live instance that would finish the
prompt first, i.e. the least of (when it is free) + (the prompt's cost there). Exact in
O(log n): a prompt costs the same on every instance except those holding its prefix, so the
best is either the earliest-free instance overall or the earliest-free prefix holder. Both
come from lazy heaps keyed by when an instance is free (keys only grow: a stale entry is
re-pushed with its current key when it reaches the top)."""

import heapq
import itertools

from services.simulator.instances import PrefillSim


def free_at(instance: PrefillSim) -> float:
    return max(instance.busy_until, instance.life.ready_s)


def _is_live(instance: PrefillSim) -> bool:
    return not instance.life.draining and instance.life.stopped_s is None


class PrefillRouter:
    def __init__(self) -> None:
        self._order = itertools.count()
        self._everyone: list = []
        self._holders: dict[int, list] = {}

    def add(self, instance: PrefillSim) -> None:
        heapq.heappush(self._everyone, (free_at(instance), next(self._order), instance))

    def _earliest(self, heap: list) -> PrefillSim | None:
        while heap:
            key, _, instance = heap[0]
            if not _is_live(instance):
                heapq.heappop(heap)
            elif key != free_at(instance):
                heapq.heapreplace(heap, (free_at(instance), next(self._order), instance))
            else:
                return instance
        return None

    def choose(self, prefix_id: int | None, cost_on) -> PrefillSim:
        """`cost_on(instance)`: when the prompt would finish there."""
        candidates = [self._earliest(self._everyone)]
        if prefix_id is not None:
            candidates.append(self._earliest(self._holders.get(prefix_id, [])))
        return min((c for c in candidates if c is not None), key=cost_on)

    def on_cached(self, instance: PrefillSim, prefix_id: int) -> None:
        """The instance now holds this prefix (call once per new prefix)."""
        heapq.heappush(self._holders.setdefault(prefix_id, []), (free_at(instance), next(self._order), instance))
