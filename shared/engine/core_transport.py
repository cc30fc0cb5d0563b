"""How the engine client reaches its engine core (shared.engine.frontend).

A `CoreTransport` starts an engine core somewhere and hands back this side's two ZeroMQ
sockets. Behind them the same `CoreLoop` runs, speaking the same typed messages
(shared.engine.core_process.messages), wherever the core is:

- `ThreadTransport` (shared.engine.thread_transport): on a thread of this process, over
  inproc sockets; the engine is already loaded (tests, offline tools, `--engine-core thread`);
- `ProcessTransport` (shared.engine.core_process.transport): in a child process over ipc://
  sockets; the child loads the model (the services' default).

The transport owns the core's life: starting it, noticing how it ended, ending it.
"""

from dataclasses import dataclass
from typing import Protocol

import zmq.asyncio

from shared.engine_api.client import EngineInfo


@dataclass
class CoreConnection:
    """This side's ends of a running core's sockets."""
    requests: zmq.asyncio.Socket   # PUSH: client -> core
    outputs: zmq.asyncio.Socket    # PULL: core -> client
    info: EngineInfo


class CoreTransport(Protocol):
    # Known before `start` where the engine is loaded already (in-thread), else None.
    info: EngineInfo | None

    async def start(self) -> CoreConnection:
        """Start a core and connect to it; EngineDeadError if it dies while starting."""

    async def wait_exit(self) -> str:
        """Wait until the core started last has ended; says how, as the end of a sentence
        ("the engine core process 7 was killed by SIGKILL")."""

    def kill(self) -> None:
        """End the core at once (its outputs could not be read)."""

    async def stop(self) -> None:
        """After the core was sent Shutdown: wait until it ended (ended by force when it does
        not within a grace period, where the transport can)."""

    def close(self) -> None:
        """Release the sockets and whatever else the last core held."""
