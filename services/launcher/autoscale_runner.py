"""Runs the planner next to a local stack (`pdserve up --autoscale`): its own asyncio loop on
a thread, reading the stack's gateway /metrics and Redis, acting through LocalActuator."""

import asyncio
import logging
import threading
from pathlib import Path

import redis.asyncio

from shared.cluster.instances import InstanceRegistry
from shared.cluster.keys import ClusterNamespace

from services.launcher.autoscale import LocalActuator
from services.launcher.stack import LocalStack
from services.planner.config import PlannerConfig
from services.planner.observer import Observer
from services.planner.planner import Planner
from services.cost_model.perf_profile import PerfProfile
from services.planner.service import PlannerService

logger = logging.getLogger(__name__)


class AutoscaleRunner:
    def __init__(self, stack: LocalStack, config: PlannerConfig, profile_path: Path, metrics_port: int = 0):
        self.stack = stack
        self.config = config
        self.profile = PerfProfile.load(profile_path)
        self.metrics_port = metrics_port
        self.actuator = LocalActuator(stack)
        self.service: PlannerService | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="planner", daemon=True)
        self._started = threading.Event()

    def _build_service(self, client: redis.asyncio.Redis) -> PlannerService:
        from shared.model.default_model import model_folder

        namespace = ClusterNamespace("default", model_folder(self.stack.config.model).name)
        gateway_metrics = self.stack.ready_info["gateway"]["metrics_address"]
        observer = Observer(InstanceRegistry(client, namespace), [f"http://{gateway_metrics}/metrics"],
                            prefill_metrics_urls=self.prefill_metrics_urls)
        planner = Planner(self.config, self.profile, self.actuator.replicas("prefill"), self.actuator.replicas("decode"))
        return PlannerService(planner, observer, self.actuator)

    def prefill_metrics_urls(self) -> list[str]:
        """/metrics of the running prefill instances (for the planner's prefix-hit ratio)."""
        urls = []
        for child in list(self.stack.instances):
            address = self.stack.ready_info.get(child.name, {}).get("metrics_address")
            if child.role == "prefill" and child.is_running() and address:
                urls.append(f"http://{address}/metrics")
        return urls

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        client = redis.asyncio.Redis.from_url(self.stack.redis_url, socket_timeout=2.0)
        try:
            self.service = self._build_service(client)
            if self.metrics_port >= 0:
                address = self.service.metrics.server.start(self.stack.config.host, self.metrics_port)
                logger.warning("planner: metrics on http://%s/metrics", address)
            self._started.set()
            await self.service.run(self._stop)
        finally:
            self._started.set()
            if self.service is not None:
                self.service.metrics.server.stop()
            await client.aclose()

    def start(self) -> None:
        self._thread.start()
        self._started.wait(30.0)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10.0)
