"""SIGINT/SIGTERM as a `threading.Event`, without taking a lock in the signal handler.

A Python signal handler runs on the main thread between two bytecodes, possibly while that
thread holds the Event's internal lock (inside `Event.wait`); calling `Event.set()` there
waits for that lock forever. So the handler only writes the signal's number to a pipe, and
a small thread reads it and sets the event (and logs), like asyncio's signal handling.
"""

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_on_signals(stop_event: threading.Event) -> Iterator[None]:
    """While inside, SIGINT/SIGTERM set `stop_event`; the previous handlers come back after.
    Main thread only (Python's rule for signal handlers)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # a burst of signals never blocks the handler
    watcher = threading.Thread(target=_set_on_signal, args=(read_fd, stop_event), name="stop-signals",
                               daemon=True)
    watcher.start()

    def on_signal(signum, _frame):
        with contextlib.suppress(BlockingIOError):
            os.write(write_fd, bytes([signum]))

    previous = {signum: signal.signal(signum, on_signal) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        os.close(write_fd)  # the watcher reads end-of-file and ends
        watcher.join()
        os.close(read_fd)


def _set_on_signal(read_fd: int, stop_event: threading.Event) -> None:
    while data := os.read(read_fd, 64):
        for signum in data:
            logger.warning("received %s: stopping the stack", signal.Signals(signum).name)
        stop_event.set()
