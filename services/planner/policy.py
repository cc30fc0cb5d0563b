"""PoolPolicy: turns one pool's computed need into a replica target without flapping.

Scale-out goes straight to the need (clamped to the pool's bounds) unless a scale event
happened less than `scale_out_cooldown_s` ago. Scale-in needs the pool to be too large even
at `1 + scale_in_margin` times the load (the hysteresis band), for `scale_in_patience`
intervals in a row, at least `scale_in_cooldown_s` after the last event, and removes at most
`max_scale_in_step` instances at a time (each one is drained, which takes a while).
"""

from dataclasses import dataclass

from services.planner.config import PlannerConfig


@dataclass(frozen=True)
class PoolDecision:
    role: str
    current: int
    desired: int
    needed: int  # the computed need at the forecast load (before bounds and hysteresis)
    action: str  # "scale_out", "scale_in", "hold"
    reason: str


class PoolPolicy:
    def __init__(self, role: str, config: PlannerConfig, replicas: int):
        self.role = role
        self.config = config
        self.bounds = config.bounds(role)
        self.replicas = self.bounds.clamp(replicas)
        self.last_event_at = float("-inf")
        self.calm_intervals = 0

    def decide(self, needed: int, needed_with_margin: int, now: float, why: str) -> PoolDecision:
        current = self.replicas
        target = self.bounds.clamp(needed)
        if target > current:
            self.calm_intervals = 0
            return self._scale_out(current, target, needed, now, why)
        if self.bounds.clamp(needed_with_margin) < current:
            return self._maybe_scale_in(current, self.bounds.clamp(needed_with_margin), needed, now, why)
        self.calm_intervals = 0
        return self._hold(current, needed, f"steady: {why}")

    def _scale_out(self, current: int, target: int, needed: int, now: float, why: str) -> PoolDecision:
        since = now - self.last_event_at
        if since < self.config.scale_out_cooldown_s:
            return self._hold(current, needed, f"scale-out to {target} held: cooldown "
                                               f"({since:.0f}/{self.config.scale_out_cooldown_s:.0f} s); {why}")
        return self._change(current, target, needed, now, "scale_out", why)

    def _maybe_scale_in(self, current: int, target: int, needed: int, now: float, why: str) -> PoolDecision:
        self.calm_intervals += 1
        patience = self.config.scale_in_patience
        if self.calm_intervals < patience:
            return self._hold(current, needed, f"scale-in pending ({self.calm_intervals}/{patience}); {why}")
        since = now - self.last_event_at
        if since < self.config.scale_in_cooldown_s:
            return self._hold(current, needed, f"scale-in held: cooldown "
                                               f"({since:.0f}/{self.config.scale_in_cooldown_s:.0f} s); {why}")
        self.calm_intervals = 0
        return self._change(current, max(target, current - self.config.max_scale_in_step), needed, now,
                            "scale_in", why)

    def _change(self, current: int, desired: int, needed: int, now: float, action: str, why: str) -> PoolDecision:
        self.replicas = desired
        self.last_event_at = now
        return PoolDecision(self.role, current, desired, needed, action, why)

    def _hold(self, current: int, needed: int, reason: str) -> PoolDecision:
        return PoolDecision(self.role, current, current, needed, "hold", reason)
