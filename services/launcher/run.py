"""Run a stack in the foreground until Ctrl-C/SIGTERM or a child dies (`pdserve up`)."""

import logging
import sys
import threading
from collections.abc import Callable
from typing import TextIO

from services.launcher.config import StackConfig
from services.launcher.errors import StackAborted, StackError
from services.launcher.report import describe
from services.launcher.stack import LocalStack
from services.launcher.stop_signals import stop_on_signals

logger = logging.getLogger(__name__)


def _nothing() -> None:
    pass


def run_stack(config: StackConfig, out: TextIO = sys.stdout,
              on_started: Callable[[LocalStack], Callable[[], None]] | None = None) -> int:
    """0 after a requested stop, 1 if a child failed to start, 130 if interrupted while
    starting. Children that die later are restarted (services.launcher.supervisor); only
    a stop request ends the stack, and then every child drains. Everything started is
    stopped before returning. `on_started(stack)` runs once the stack is SERVING (the
    autoscaler) and returns what stops it."""
    logging.getLogger("services.launcher").setLevel(logging.INFO)
    stop_event = threading.Event()
    with stop_on_signals(stop_event):
        stack = LocalStack(config)
        logger.info("starting the stack; logs in %s", stack.run_dir / "logs")
        stop_extras = _nothing
        try:
            stack.start(should_abort=stop_event.is_set)
            print(describe(stack), file=out, flush=True)
            if on_started is not None:
                stop_extras = on_started(stack)
            stack.supervise(stop_event)
        except StackAborted as error:
            logger.warning("%s", error)
            return 130
        except StackError as error:
            logger.error("the stack failed: %s", error)
            return 1
        finally:
            stop_extras()
            stack.stop()
    logger.info("stack stopped; logs kept in %s", stack.run_dir / "logs")
    return 0
