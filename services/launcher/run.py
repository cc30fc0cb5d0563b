"""Run a stack in the foreground until Ctrl-C/SIGTERM or a child dies (`pdserve up`)."""

import logging
import signal
import sys
import threading
from typing import TextIO

from services.launcher.config import StackConfig
from services.launcher.errors import StackAborted, StackError
from services.launcher.report import describe
from services.launcher.stack import LocalStack

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _install_stop_handlers(stop_event: threading.Event) -> dict:
    """SIGINT/SIGTERM set `stop_event`; returns the previous handlers."""
    def on_signal(signum, _frame):
        logger.warning("received %s: stopping the stack", signal.Signals(signum).name)
        stop_event.set()

    return {signum: signal.signal(signum, on_signal) for signum in STOP_SIGNALS}


def run_stack(config: StackConfig, out: TextIO = sys.stdout) -> int:
    """0 after a requested stop, 1 if a child failed to start, 130 if interrupted while
    starting. Children that die later are restarted (services.launcher.supervisor); only
    a stop request ends the stack, and then every child drains. Everything started is
    stopped before returning."""
    logging.getLogger("services.launcher").setLevel(logging.INFO)
    stop_event = threading.Event()
    previous = _install_stop_handlers(stop_event)
    stack = LocalStack(config)
    logger.info("starting the stack; logs in %s", stack.run_dir / "logs")
    try:
        stack.start(should_abort=stop_event.is_set)
        print(describe(stack), file=out, flush=True)
        stack.supervise(stop_event)
    except StackAborted as error:
        logger.warning("%s", error)
        return 130
    except StackError as error:
        logger.error("the stack failed: %s", error)
        return 1
    finally:
        stack.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    logger.info("stack stopped; logs kept in %s", stack.run_dir / "logs")
    return 0
