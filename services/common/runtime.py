"""InstanceRuntime: one engine instance's life, from loading to a clean exit.

start():  gRPC server up (health NOT_SERVING) -> engine loaded -> metrics wired (and the
          /metrics listener up with --metrics-port) -> role handlers started (the KV
          receiver listens) -> health SERVING -> registered in Redis with heartbeats and
          the prefix-index publisher -> ready file written.
engine failure (the step loop died: forward pass, worker, memory): health NOT_SERVING and
          deregistered at once, then `failed` is set and the entry stops the instance and exits
          non-zero so a supervisor restarts it; it never stays registered answering 503s.
stop():   draining (new requests UNAVAILABLE, health NOT_SERVING) -> deregistered and prefix
          index dropped (gateways stop routing here) -> accepted work finishes, up to
          --drain-timeout-s: running prefills, Decode calls for granted reservations (their RPCs
          are still accepted), running decodes -> gRPC server stopped with grace (what is still
          in flight is cancelled, which frees what it held) -> role handlers stopped (reservations
          released, UCX closed) -> Redis client closed -> engine thread stopped -> /metrics
          listener closed. Safe after a partial start.
"""

import asyncio
import logging
import socket
import uuid
from collections.abc import Callable

from shared.cluster.instances import InstanceInfo
from shared.engine.async_engine import AsyncEngine
from shared.engine.llm_engine import LLMEngine
from shared.pb.pdserve.v1 import instance_pb2 as pb
from services.common.engine_setup import start_engine
from services.common.grpc_server import GrpcServer, host_port
from services.common.metrics import InstanceMetrics
from services.common.presence import ClusterPresence
from services.common.ready_file import write_ready_file
from services.common.role import RoleHandlers
from services.common.servicer import InstanceServicer
from services.common.settings import InstanceSettings
from services.common.status import engine_status
from services.common.tls import instance_credentials

logger = logging.getLogger(__name__)

WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")
DRAIN_POLL_S = 0.05
# After handing work back, how long its calls get to end before the server stops.
HAND_BACK_WAIT_S = 2.0


def new_instance_id(role: str) -> str:
    """The id of an instance started without --instance-id."""
    return f"{role}-{uuid.uuid4().hex[:12]}"


def advertised_host(settings: InstanceSettings) -> str:
    if settings.advertise_host:
        return settings.advertise_host
    return socket.gethostname() if settings.host in WILDCARD_HOSTS else settings.host


class InstanceRuntime:
    def __init__(self, settings: InstanceSettings, build_handlers: Callable[["InstanceRuntime"], RoleHandlers]):
        self.settings = settings
        self.role = settings.role
        self.instance_id = settings.instance_id or new_instance_id(settings.role)
        self.build_handlers = build_handlers
        self.async_engine: AsyncEngine | None = None
        self.handlers: RoleHandlers | None = None  # set once all have started
        self._started_handlers: list = []
        self.presence: ClusterPresence | None = None
        self.server: GrpcServer | None = None
        self.metrics: InstanceMetrics | None = None
        self.grpc_address = ""
        self.metrics_address = ""  # "host:port" of /metrics, "" without --metrics-port
        self.is_draining = False
        self._is_stopped = False
        # Set once the engine failed as a whole and the instance left routing.
        self.failed = asyncio.Event()
        self._background: set[asyncio.Task] = set()

    @property
    def engine(self) -> LLMEngine:
        return self.async_engine.engine

    @property
    def ucx_address(self) -> str:
        return self.handlers.ucx_address if self.handlers is not None else ""

    async def start(self) -> None:
        self.server = GrpcServer(InstanceServicer(self), self.settings.host, self.settings.bound_grpc_port,
                                 instance_credentials(self.settings))
        port = await self.server.start()
        self.grpc_address = host_port(advertised_host(self.settings), port)
        logger.info("%s %s: gRPC on %s, loading the engine", self.role, self.instance_id, self.grpc_address)
        self.async_engine = await start_engine(self.settings)
        self._watch_engine_failure(asyncio.get_running_loop())
        model_name = self.settings.served_model_name or self.engine.kv_manager.model_key
        self._start_metrics(model_name)
        self.presence = ClusterPresence(self.settings, model_name)
        handlers = self.build_handlers(self)
        for handler in handlers.all():
            await handler.start()
            self._started_handlers.append(handler)
        self.handlers = handlers
        await self.server.set_serving(True)
        self.presence.start(self.info(), self.async_engine)
        if self.settings.ready_file:
            write_ready_file(self.settings.ready_file, self.grpc_address, self.ucx_address, self.instance_id, self.role,
                             self.metrics_address)
        logger.info("%s %s serving on %s (KV receiver: %s, metrics: %s)", self.role, self.instance_id,
                    self.grpc_address, self.ucx_address or "none", self.metrics_address or "none")

    def _watch_engine_failure(self, loop: asyncio.AbstractEventLoop) -> None:
        def on_failure(error: BaseException) -> None:  # on the engine thread
            loop.call_soon_threadsafe(self._start_leaving, error)

        self.async_engine.on_failure = on_failure
        if self.async_engine.error is not None:
            self._start_leaving(self.async_engine.error)

    def _start_leaving(self, error: BaseException) -> None:
        task = asyncio.get_running_loop().create_task(self._leave_after_failure(error))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _leave_after_failure(self, error: BaseException) -> None:
        """The engine failed as a whole: NOT_SERVING and out of Redis now, then `failed`."""
        logger.error("%s %s: engine failed (%s); leaving the pool", self.role, self.instance_id, error)
        try:
            await self.begin_draining()
            if self.presence is not None:
                await self.presence.withdraw()
        finally:
            self.failed.set()

    def _start_metrics(self, model_name: str) -> None:
        """Histograms observed on the engine thread from here on; /metrics if a port is set."""
        self.metrics = InstanceMetrics(self, model_name)
        self.async_engine.observer = self.metrics.tracker
        self.metrics_address = self.metrics.start(self.settings.host, self.settings.metrics_port)

    def info(self) -> InstanceInfo:
        return InstanceInfo(self.instance_id, self.role, self.grpc_address, self.ucx_address,
                            self.presence.namespace.model, cache=self.engine.cache_settings())

    async def status(self) -> pb.InstanceStatus:
        status = await self.async_engine.call(engine_status, self.engine)
        status.instance_id, status.role = self.instance_id, self.role
        for handler in self.handlers.all():
            handler.add_status(status)
        return status

    async def begin_draining(self) -> None:
        """Refuse new requests and report NOT_SERVING; what is admitted carries on."""
        self.is_draining = True
        if self.server is not None:
            await self.server.set_serving(False)

    def has_accepted_work(self) -> bool:
        """Requests waiting, running or reserved in the engine (a granted reservation counts)."""
        if self.async_engine is None:
            return False
        load = self.async_engine.load()
        return load.num_waiting + load.num_running + load.num_reserved > 0

    async def _finish_accepted_work(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.has_accepted_work() and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if not self.has_accepted_work():
            logger.info("drained: no accepted work left")
            return
        logger.warning("drain timeout (%.1f s) reached with work left; handing it back", timeout_s)
        for handler in self.handlers.all() if self.handlers is not None else ():
            await handler.hand_back()
        deadline = loop.time() + HAND_BACK_WAIT_S
        while self.has_accepted_work() and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)

    async def stop(self) -> None:
        """Idempotent; see the module docstring for the order."""
        if self._is_stopped:
            return
        self._is_stopped = True
        logger.info("%s %s shutting down", self.role, self.instance_id)
        await self.begin_draining()
        if self.presence is not None:
            await self.presence.withdraw()
        await self._finish_accepted_work(self.settings.drain_timeout_s)
        if self.server is not None:
            await self.server.stop(self.settings.shutdown_grace_s)
        for handler in reversed(self._started_handlers):
            await handler.stop()
        if self.presence is not None:
            await self.presence.close()
        if self.async_engine is not None:
            await asyncio.to_thread(self.async_engine.stop)
        if self.metrics is not None:
            self.metrics.stop()
        logger.info("%s %s stopped", self.role, self.instance_id)
