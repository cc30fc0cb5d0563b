"""Starting an engine-core child process: private ipc:// sockets, the startup bytes on its
stdin, and the `Ready` handshake (raced against the child's exit, so a core that dies while
loading is reported at once with its exit status)."""

import asyncio
import shutil
import signal
import tempfile
from dataclasses import dataclass

import zmq
import zmq.asyncio

from shared.config import EngineConfig
from shared.engine.core_process.messages import (PROTOCOL_VERSION, CoreFailed, CoreStartup, ProtocolError, Ready,
                                                 check_version, decode_core_message, encode)
from shared.engine_api.client import EngineDeadError
from shared.executor.python_child import child_environment, module_command
from shared.memory.idle_trim import TrimPolicy

CORE_MODULE = "shared.engine.core_process.main"


@dataclass
class CoreHandle:
    """A running core: its process and this side's ends of the two sockets."""
    process: asyncio.subprocess.Process
    context: zmq.asyncio.Context
    requests: zmq.asyncio.Socket   # PUSH, bound: service -> core
    outputs: zmq.asyncio.Socket    # PULL, bound: core -> service
    folder: str                    # the private directory of the ipc:// socket files
    ready: Ready

    def close(self) -> None:
        self.requests.close(linger=0)
        self.outputs.close(linger=0)
        self.context.term()
        shutil.rmtree(self.folder, ignore_errors=True)


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


async def spawn_core(config: EngineConfig, trim_policy: TrimPolicy, startup_timeout_s: float) -> CoreHandle:
    """Start a core and wait for its Ready; EngineDeadError if it exits or times out first."""
    folder = tempfile.mkdtemp(prefix="pdserve-core-")
    context = zmq.asyncio.Context()
    requests, outputs = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    input_address, output_address = f"ipc://{folder}/requests", f"ipc://{folder}/outputs"
    requests.bind(input_address)
    outputs.bind(output_address)
    process = None
    try:
        process = await asyncio.create_subprocess_exec(*module_command(CORE_MODULE), stdin=asyncio.subprocess.PIPE,
                                                       env=child_environment())
        startup = CoreStartup(PROTOCOL_VERSION, config, input_address, output_address, trim_policy)
        process.stdin.write(encode(startup))
        await process.stdin.drain()
        process.stdin.close()
        ready = await _handshake(process, outputs, startup_timeout_s)
        return CoreHandle(process, context, requests, outputs, folder, ready)
    except BaseException:
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()
        requests.close(linger=0)
        outputs.close(linger=0)
        context.term()
        shutil.rmtree(folder, ignore_errors=True)
        raise


async def _handshake(process: asyncio.subprocess.Process, outputs: zmq.asyncio.Socket, timeout_s: float) -> Ready:
    receive = asyncio.ensure_future(outputs.recv())
    exited = asyncio.ensure_future(process.wait())
    try:
        done, _ = await asyncio.wait({receive, exited}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (receive, exited):
            task.cancel()
    if receive in done:
        message = decode_core_message(receive.result())
        if isinstance(message, Ready):
            check_version(message.protocol_version, "the engine core")
            return message
        if isinstance(message, CoreFailed):
            raise EngineDeadError(f"the engine core failed while starting: {message.error}")
        raise ProtocolError(f"the engine core's first message is {type(message).__name__}, not Ready")
    if exited in done:
        raise EngineDeadError(f"the engine core process {describe_exit(process.returncode)} while starting")
    raise EngineDeadError(f"the engine core did not start within {timeout_s:.0f} s")
