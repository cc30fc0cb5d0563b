"""The engine core on a thread of this process (`CoreTransport`, shared.engine.core_transport):
the `CoreLoop` of an already loaded `EngineCore`, reached over inproc ZeroMQ sockets with the
same typed messages as a core process. For tests, offline tools and `--engine-core thread`.

All engine state is touched on the engine thread only. A failure of the loop (the engine as a
whole) ends the thread; `wait_exit` then says why. A thread cannot be killed: `kill` asks the
loop to stop, and `stop` leaves a thread that does not end within the grace period behind
(a daemon) with a warning. An engine thread starts once.
"""

import asyncio
import contextlib
import itertools
import logging
import threading

import torch
import zmq
import zmq.asyncio

from shared.engine_api.client import EngineInfo
from shared.engine.core_process.core_loop import CoreLoop
from shared.engine.core_process.messages import Shutdown, encode
from shared.engine.core_transport import CoreConnection
from shared.engine.engine_core import EngineCore
from shared.engine.introspection import engine_info
from shared.isolation import describe_error

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 30.0
LINGER_MS = 1000  # how long the loop's last outputs may wait for this side once it ended
_addresses = itertools.count()


class ThreadTransport:
    def __init__(self, core: EngineCore, on_loop=None, num_threads: int | None = None):
        """`on_loop(is_idle)`: called on every loop iteration (memory trimming); `num_threads`:
        torch threads of the steps (a per-thread setting: set on the engine thread)."""
        self.core = core
        self.on_loop = on_loop
        self.num_threads = num_threads
        self.info: EngineInfo = engine_info(core)
        self._thread: threading.Thread | None = None
        self._context: zmq.asyncio.Context | None = None
        self._connection: CoreConnection | None = None
        self._exit: asyncio.Future | None = None

    async def start(self) -> CoreConnection:
        if self._thread is not None:
            raise RuntimeError("an engine thread starts once")
        context = self._context = zmq.asyncio.Context()
        requests, outputs = context.socket(zmq.PUSH), context.socket(zmq.PULL)
        address = f"inproc://engine-{next(_addresses)}"
        requests.bind(f"{address}/requests")
        outputs.bind(f"{address}/outputs")
        loop = asyncio.get_running_loop()
        self._exit = loop.create_future()
        self._thread = threading.Thread(target=self._run, args=(loop, address), name="engine", daemon=True)
        self._thread.start()
        self._connection = CoreConnection(requests, outputs, self.info)
        return self._connection

    async def wait_exit(self) -> str:
        return await asyncio.shield(self._exit)

    def kill(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._connection.requests.send(encode(Shutdown()))

    async def stop(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._exit), SHUTDOWN_TIMEOUT_S)
        if not self._exit.done():
            logger.warning("the engine thread did not stop within %.0f s; leaving it behind", SHUTDOWN_TIMEOUT_S)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        connection.requests.close(linger=0)
        connection.outputs.close(linger=0)
        if self._exit.done():  # the thread closed its sockets: the context can end
            self._context.term()
        self.core.guided.shutdown()
        if self.core.connector is not None:
            self.core.connector.shutdown()

    # ---- the engine thread -----------------------------------------------------------------

    def _run(self, loop: asyncio.AbstractEventLoop, address: str) -> None:
        context = zmq.Context.shadow(self._context.underlying)
        inbox, outbox = context.socket(zmq.PULL), context.socket(zmq.PUSH)
        inbox.connect(f"{address}/requests")
        outbox.connect(f"{address}/outputs")
        how = "the engine thread stopped"
        try:
            if self.num_threads:
                torch.set_num_threads(self.num_threads)
            CoreLoop(self.core, inbox, outbox, self.on_loop).run()
        except BaseException as error:  # noqa: BLE001 - the engine as a whole failed: say how
            logger.exception("the engine thread failed")
            how = f"the engine thread failed: {describe_error(error)}"
        finally:
            inbox.close(linger=0)
            outbox.close(linger=LINGER_MS)
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, self._exit, how)


def _settle(future: asyncio.Future, how: str) -> None:
    if not future.done():
        future.set_result(how)
