"""CoreProcessClient: the engine client (shared.engine.frontend) with its core in a child
process (shared.engine.core_process.transport): the scheduler, executor and KV connector run
there; this process keeps tokenization, detokenization, stop strings and streaming.

A crash of the core is seen at once through the child's exit: every stream and call in flight
fails with EngineDeadError naming how it died, `is_alive` turns False and `on_failure` runs.
`restart()` starts a fresh core (the model is loaded again); requests of the dead core are
gone with it.
"""

from shared.config import EngineConfig
from shared.engine.core_process.transport import DEFAULT_STARTUP_TIMEOUT_S, ProcessTransport
from shared.engine.frontend import EngineFrontend
from shared.memory.idle_trim import TrimPolicy


class CoreProcessClient(EngineFrontend):
    transport: ProcessTransport

    def __init__(self, config: EngineConfig, tokenizer=None, trim_policy: TrimPolicy = TrimPolicy(),
                 startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S):
        """`tokenizer`: the model's, for detokenization and stop strings (None: token ids only)."""
        super().__init__(ProcessTransport(config, trim_policy, startup_timeout_s), tokenizer)
        self.config = config

    @property
    def pid(self) -> int | None:
        return self.transport.pid

    @property
    def num_starts(self) -> int:
        return self.transport.num_starts

    async def restart(self) -> None:
        """After the core died: start a fresh one."""
        await self.stop()
        await self.start()
