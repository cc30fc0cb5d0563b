"""InstanceRuntime: one engine instance's life, from loading to a clean exit.

start():  gRPC server up (health NOT_SERVING) -> engine loaded -> metrics wired (and the
          /metrics listener up with --metrics-port) -> role handlers started (the KV
          receiver listens) -> health SERVING -> registered in Redis with heartbeats and
          the prefix-index publisher -> the OpenAI HTTP API up with --openai-port
          (services.instance.openai_door) -> ready file written.
engine failure (the step loop died: forward pass, worker, memory; or the engine-core process
          died): health NOT_SERVING and deregistered at once (what was in flight failed with
          EngineDeadError). An engine core in a child process is then restarted in place (the
          model loaded again) and the instance serves and registers again, up to
          --max-engine-restarts within --engine-restart-window-s; past that (a crash loop), or
          for an engine thread, `failed` is set and the entry stops the instance and exits
          non-zero so a supervisor restarts it; it never stays registered answering 503s.
stop():   draining (new requests UNAVAILABLE, health NOT_SERVING) -> the OpenAI HTTP API closed
          (its open responses get --shutdown-grace-s) -> registered as DRAINING
          and prefix index dropped (gateways stop routing here; `pdserve status` shows it) ->
          accepted work finishes, up to --drain-timeout-s: running prefills, Decode calls for
          granted reservations (their RPCs are still accepted), running decodes -> deregistered
          -> gRPC server stopped with grace (what is still
          in flight is cancelled, which frees what it held) -> role handlers stopped (reservations
          released, UCX closed) -> Redis client closed -> engine thread stopped -> /metrics
          listener closed. Safe after a partial start.
"""

import asyncio
import logging
import socket
import uuid
from collections.abc import Callable

from shared.cluster.instances import DRAINING, SERVING, InstanceInfo
from shared.engine_api.client import EngineClient, EngineDeadError
from shared.errors import ConfigurationError, InvalidRequestError
from shared.hosts import host_port, is_wildcard
from shared.pb.pdserve.v1 import instance_pb2 as pb
from services.instance.engine_restart import RestartBudget
from services.instance.engine_setup import start_engine
from services.instance.lora_adapters import AdapterTable
from services.instance.peer_handler import PeerHandler
from services.instance.presence import ClusterPresence
from services.instance.role import RoleHandlers
from services.instance.servicer import InstanceServicer
from services.instance.settings import OPENAI_OFF, InstanceSettings, lora_config, parse_lora_modules
from services.instance.status import status_to_proto
from services.observability.instance_metrics import InstanceMetrics
from services.rpc.ready_file import write_ready_file
from services.rpc.server import GrpcServer, instance_grpc_server, keepalive_options
from services.tls.credentials import instance_credentials

logger = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05
# After handing work back, how long its calls get to end before the server stops.
HAND_BACK_WAIT_S = 2.0


def new_instance_id(role: str) -> str:
    """The id of an instance started without --instance-id."""
    return f"{role}-{uuid.uuid4().hex[:12]}"


def advertised_host(settings: InstanceSettings) -> str:
    if settings.advertise_host:
        return settings.advertise_host
    return socket.gethostname() if is_wildcard(settings.host) else settings.host


class InstanceRuntime:
    def __init__(self, settings: InstanceSettings, build_handlers: Callable[["InstanceRuntime"], RoleHandlers],
                 load_openai_model: Callable | None = None):
        """`load_openai_model`: the OpenAI door's ServedModel (None: read from the model folder)."""
        self.settings = settings
        self.role = settings.role
        self.instance_id = settings.instance_id or new_instance_id(settings.role)
        self.build_handlers = build_handlers
        self.engine: EngineClient | None = None
        self.handlers: RoleHandlers | None = None  # set once all have started
        self._started_handlers: list = []
        self.presence: ClusterPresence | None = None
        self.server: GrpcServer | None = None
        self.metrics: InstanceMetrics | None = None
        self.grpc_address = ""
        self.metrics_address = ""  # "host:port" of /metrics, "" without --metrics-port
        self.load_openai_model = load_openai_model
        self.openai = None  # services.instance.openai_door.OpenAIDoor with --openai-port
        self.openai_address = ""  # "host:port" of the OpenAI HTTP API, "" without --openai-port
        self.is_draining = False
        self._is_stopped = False
        # Set once the engine failed as a whole and the instance left routing.
        self.failed = asyncio.Event()
        self.restart_budget = RestartBudget(settings.max_engine_restarts, settings.engine_restart_window_s)
        # The LoRA adapters served, by name (--lora-modules, and loads at run time).
        self.adapters = AdapterTable(lora_config(settings))
        self._background: set[asyncio.Task] = set()

    @property
    def ucx_address(self) -> str:
        return self.engine.info.kv_transfer_address if self.engine is not None else ""

    async def start(self) -> None:
        self.server = instance_grpc_server(InstanceServicer(self), self.settings.host, self.settings.bound_grpc_port,
                                           instance_credentials(self.settings), keepalive_options(
                                               self.settings.client_keepalive_s,
                                               self.settings.client_keepalive_timeout_s))
        port = await self.server.start()
        self.grpc_address = host_port(advertised_host(self.settings), port)
        logger.info("%s %s: gRPC on %s, loading the engine", self.role, self.instance_id, self.grpc_address)
        self._load_lora_modules()
        self.engine = await start_engine(self.settings)
        self._watch_engine_failure(asyncio.get_running_loop())
        model_name = self.settings.served_model_name or self.engine.info.cache.model_id
        self._start_metrics(model_name)
        self.presence = ClusterPresence(self.settings, model_name)
        self.presence.read_more_tiers = self.peer_tier_stats
        handlers = self.build_handlers(self)
        if self.settings.kv_peer_reuse:
            handlers.peer = PeerHandler(self)
        for handler in handlers.all():
            await handler.start()
            self._started_handlers.append(handler)
        self.handlers = handlers
        await self.server.set_serving(True)
        self.presence.start(self.info(), self.engine)
        await self._open_openai_door()
        if self.settings.ready_file:
            write_ready_file(self.settings.ready_file, self.grpc_address, self.ucx_address, self.instance_id, self.role,
                             self.metrics_address, self.openai_address, self.presence.namespace)
        logger.info("%s %s serving on %s (KV receiver: %s, metrics: %s)", self.role, self.instance_id,
                    self.grpc_address, self.ucx_address or "none", self.metrics_address or "none")

    async def _open_openai_door(self) -> None:
        """With --openai-port: the OpenAI-compatible HTTP API (services.instance.openai_door)."""
        if self.settings.openai_port == OPENAI_OFF:
            return
        from services.instance.openai_door import served_model, start_openai_door  # FastAPI: only when asked for
        try:
            self.openai = await start_openai_door(self, self.load_openai_model or (lambda: served_model(self.settings)))
        except OSError as error:
            raise ConfigurationError("openai_port", f"cannot listen on {self.settings.host}:"
                                                    f"{self.settings.openai_port}: {error.strerror}") from error
        self.openai_address = self.openai.http.address

    def _watch_engine_failure(self, loop: asyncio.AbstractEventLoop) -> None:
        def on_failure(error: BaseException) -> None:  # on the engine thread
            loop.call_soon_threadsafe(self._start_leaving, error)

        self.engine.on_failure = on_failure
        if not self.engine.is_alive:
            self._start_leaving(EngineDeadError("the engine stopped while starting"))

    def _start_leaving(self, error: BaseException) -> None:
        task = asyncio.get_running_loop().create_task(self._leave_after_failure(error))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _leave_after_failure(self, error: BaseException) -> None:
        """The engine failed as a whole: NOT_SERVING and out of Redis now; then an engine
        core process is restarted in place (within the restart budget), else `failed`."""
        logger.error("%s %s: engine failed (%s); leaving the pool", self.role, self.instance_id, error)
        is_restarted = False
        try:
            await self.begin_draining()
            if self.presence is not None:
                await self.presence.withdraw()
            is_restarted = await self._restart_engine()
        finally:
            if not is_restarted:
                self.failed.set()

    async def _restart_engine(self) -> bool:
        """Start a fresh engine core, then serve and register again; False when the engine
        cannot restart (in-thread), the budget is spent (a crash loop), or stopping began."""
        restart = getattr(self.engine, "restart", None)
        if restart is None or self._is_stopped:
            return False
        if not self.restart_budget.try_take():
            logger.error("%s %s: the engine core crashed %d times within %.0f s; giving up", self.role,
                         self.instance_id, self.restart_budget.num_recent + 1, self.restart_budget.window_s)
            return False
        try:
            await restart()
        except Exception:  # noqa: BLE001 - a core that cannot start again ends the instance
            logger.exception("%s %s: restarting the engine core failed", self.role, self.instance_id)
            return False
        if self._is_stopped:
            return True  # stop() owns the rest
        for handler in self.handlers.all() if self.handlers is not None else ():
            await handler.on_engine_restart()
        self.is_draining = False
        await self.server.set_serving(True)
        self.presence.start(self.info(), self.engine)
        logger.info("%s %s: engine core restarted (%d recent restarts); serving again", self.role,
                    self.instance_id, self.restart_budget.num_recent)
        return True

    def _start_metrics(self, model_name: str) -> None:
        """Histograms observed on the engine thread from here on; /metrics if a port is set."""
        self.metrics = InstanceMetrics(self, model_name)
        self.engine.observer = self.metrics.tracker
        self.metrics_address = self.metrics.start(self.settings.host, self.settings.metrics_port)

    def peer_tier_stats(self) -> tuple:
        """The peer tier as this instance's prefill handler pulls from it (empty without one)."""
        prefill = self.handlers.prefill if self.handlers is not None else None
        return (prefill.peers.stats(),) if prefill is not None and prefill.peers.is_enabled else ()

    def info(self) -> InstanceInfo:
        return InstanceInfo(self.instance_id, self.role, self.grpc_address, self.ucx_address,
                            self.presence.namespace.model, cache=self.engine.info.cache,
                            kv_tier_id=self.engine.info.kv_tier_id,
                            lora_adapters=tuple(sorted(self.adapters.registered().items())),
                            state=DRAINING if self.is_draining else SERVING,
                            kv_events_endpoint=self.settings.engine.kv_events_endpoint)

    def _load_lora_modules(self) -> None:
        """The --lora-modules adapters, checked before the model loads (a bad one stops the start)."""
        for name, path in parse_lora_modules(self.settings.lora_modules).items():
            try:
                self.adapters.load(name, path)
            except InvalidRequestError as error:
                raise ConfigurationError("lora_modules", f"{name}: {error.message}") from None

    async def load_adapter(self, name: str, path: str) -> str:
        """Serve another LoRA adapter from now on (and tell the cluster); returns its key."""
        key = self.adapters.load(name, path)
        await self._announce_adapters()
        return key

    async def unload_adapter(self, name: str) -> None:
        self.adapters.unload(name)
        await self._announce_adapters()

    async def _announce_adapters(self) -> None:
        if self.presence is not None and self.engine is not None and self.handlers is not None:
            await self.presence.update_info(self.info(), self.engine)

    async def status(self) -> pb.InstanceStatus:
        status = status_to_proto(await self.engine.status())
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
        if self.engine is None:
            return False
        load = self.engine.load()
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
        if self.openai is not None:  # GET /health says 503 already; open responses get the grace
            await self.openai.stop(self.settings.shutdown_grace_s)
        if self.presence is not None and self.engine is not None:
            await self.presence.mark_draining(self.info(), self.engine)
        await self._finish_accepted_work(self.settings.drain_timeout_s)
        if self.presence is not None:
            await self.presence.withdraw()
        if self.server is not None:
            await self.server.stop(self.settings.shutdown_grace_s)
        for handler in reversed(self._started_handlers):
            await handler.stop()
        if self.presence is not None:
            await self.presence.close()
        if self.engine is not None:
            await self.engine.stop()
        if self.metrics is not None:
            self.metrics.stop()
        logger.info("%s %s stopped", self.role, self.instance_id)
