"""The engine core in a child process (`CoreTransport`, shared.engine.core_transport): spawned
with its own copy of the model, reached over private ipc:// sockets. A crash of the child (a
Python exception, a segfault, SIGKILL) is seen at once through its exit, not a timeout."""

import asyncio
import logging

from shared.config import EngineConfig
from shared.engine_api.client import EngineInfo
from shared.engine.core_process.spawn import CoreHandle, describe_exit, spawn_core
from shared.engine.core_transport import CoreConnection
from shared.memory.idle_trim import TrimPolicy

logger = logging.getLogger(__name__)

DEFAULT_STARTUP_TIMEOUT_S = 600.0
SHUTDOWN_TIMEOUT_S = 10.0


class ProcessTransport:
    def __init__(self, config: EngineConfig, trim_policy: TrimPolicy = TrimPolicy(),
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S):
        self.config = config
        self.trim_policy = trim_policy
        self.startup_timeout_s = startup_timeout_s
        self.info: EngineInfo | None = None
        self.num_starts = 0
        self._core: CoreHandle | None = None

    @property
    def pid(self) -> int | None:
        return self._core.process.pid if self._core is not None else None

    async def start(self) -> CoreConnection:
        core = await spawn_core(self.config, self.trim_policy, self.startup_timeout_s)
        self._core, self.info, self.num_starts = core, core.ready.info, self.num_starts + 1
        logger.info("engine core process %d ready: %d KV blocks of %d tokens", core.process.pid,
                    self.info.num_blocks, self.info.cache.block_size)
        return CoreConnection(core.requests, core.outputs, core.ready.info)

    async def wait_exit(self) -> str:
        process = self._core.process
        returncode = await process.wait()
        return f"the engine core process {process.pid} {describe_exit(returncode)}"

    def kill(self) -> None:
        if self._core is not None and self._core.process.returncode is None:
            self._core.process.kill()

    async def stop(self) -> None:
        process = self._core.process
        if process.returncode is not None:
            return
        try:
            await asyncio.wait_for(process.wait(), SHUTDOWN_TIMEOUT_S)
        except asyncio.TimeoutError:
            logger.warning("engine core %d did not stop in time; killing it", process.pid)
            process.kill()
            await process.wait()

    def close(self) -> None:
        core, self._core = self._core, None
        if core is not None:
            core.close()
