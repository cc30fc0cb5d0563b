"""Entry point of the engine-core process: `python -m shared.engine.core_process.main`.

Reads its `CoreStartup` (msgspec bytes) from stdin, loads the engine, connects to the
service's sockets, says `Ready`, and runs the core loop until told to shut down. A failure of
the engine as a whole is sent as `CoreFailed` and ends the process with exit status 1; the
service sees the exit at once and restarts it. The process dies with its parent.
"""

import ctypes
import logging
import os
import signal
import sys

import zmq

from shared.engine.core_process.core_loop import CoreLoop
from shared.engine.core_process.messages import (PROTOCOL_VERSION, CoreFailed, CoreStartup, ProtocolError, Ready,
                                                 decode_startup, encode)
from shared.engine.introspection import engine_info
from shared.executor.python_child import is_orphaned
from shared.engine.engine_core import EngineCore
from shared.isolation import describe_error
from shared.logging_setup import configure_child_logging
from shared.logging_setup.process_exit import exit_without_teardown
from shared.tracing import configure_child_tracing, shutdown_tracing
from shared.memory.idle_trim import HeapTrimmer

logger = logging.getLogger("shared.engine.core_process")

PR_SET_PDEATHSIG = 1
# How long a final message may wait for the service before the process exits anyway.
LINGER_MS = 1000


def die_with_parent() -> None:
    """Linux: get SIGKILL when the service process exits, so a core never outlives it. The
    request comes after this module's imports (seconds on a loaded machine): a service killed
    in that window (while starting) left its core orphaned, so check for that too."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if is_orphaned():
        logger.error("engine core: the service process that started it is gone; exiting")
        os._exit(3)


def build_core(startup: CoreStartup) -> EngineCore:
    from shared.engine.loading import build_engine_parts
    return EngineCore(startup.config, *build_engine_parts(startup.config))


def serve(startup: CoreStartup) -> None:
    context = zmq.Context()
    inbox, outbox = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    outbox.setsockopt(zmq.LINGER, LINGER_MS)
    inbox.connect(startup.input_address)
    outbox.connect(startup.output_address)
    core = None
    try:
        core = build_core(startup)
        outbox.send(encode(Ready(PROTOCOL_VERSION, engine_info(core), os.getpid())))
        CoreLoop(core, inbox, outbox, HeapTrimmer(startup.trim_policy).on_loop).run()
    except BaseException as error:
        outbox.send(encode(CoreFailed(describe_error(error))))
        raise
    finally:
        if core is not None:
            core.shutdown()
        inbox.close(linger=0)
        outbox.close()
        context.term()


def main() -> int:
    die_with_parent()
    # Ctrl-C in a terminal reaches the whole process group: the service decides when the core
    # stops (Shutdown after its drain), not the keyboard.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_child_logging(f"engine-core[{os.getpid()}]")
    configure_child_tracing("pdserve-engine-core")
    try:
        startup = decode_startup(sys.stdin.buffer.read())
    except ProtocolError as error:
        logger.error("engine core: %s", error)
        return 2
    try:
        serve(startup)
    except Exception:  # noqa: BLE001 - reported above; the exit status tells the service
        logger.exception("engine core failed")
        return 1
    finally:
        shutdown_tracing()  # exports the spans still buffered
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())
