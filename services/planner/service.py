"""PlannerService: the loop. Every interval: observe, plan, tell the actuator, export."""

import asyncio
import logging
import time
from collections.abc import Callable

from services.planner.actuator import Actuator
from services.planner.metrics import PlannerMetrics
from services.planner.observer import Observer
from services.planner.planner import PlanDecision, Planner

logger = logging.getLogger(__name__)


class PlannerService:
    def __init__(self, planner: Planner, observer: Observer, actuator: Actuator,
                 metrics: PlannerMetrics | None = None, clock: Callable[[], float] = time.monotonic):
        self.planner = planner
        self.observer = observer
        self.actuator = actuator
        self.metrics = metrics or PlannerMetrics()
        self.clock = clock
        self.decisions: list[PlanDecision] = []

    async def step(self) -> PlanDecision:
        """One interval's work; the policies start from the actuator's current counts."""
        for policy in (self.planner.prefill, self.planner.decode):
            policy.replicas = self.actuator.replicas(policy.role)
        decision = self.planner.plan(await self.observer.observe(), self.clock())
        for pool in (decision.prefill, decision.decode):
            if pool.desired != pool.current:
                logger.warning("planner: %s %s %d -> %d (%s)", pool.action, pool.role, pool.current,
                               pool.desired, pool.reason)
                self.actuator.scale(pool.role, pool.desired)
        self.metrics.collector.record(decision)
        self.decisions.append(decision)
        return decision

    async def run(self, stop: asyncio.Event) -> None:
        await self.observer.observe()  # the baseline snapshot for the first interval's rates
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.planner.config.interval_s)
                return
            except TimeoutError:
                pass
            try:
                await self.step()
            except Exception:  # noqa: BLE001 - one bad interval (Redis down) must not end the planner
                logger.exception("planner interval failed; retrying next interval")
