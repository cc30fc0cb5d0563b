"""services.launcher.stop_signals: SIGINT/SIGTERM become a threading.Event without the
signal handler taking a lock, so a signal that lands while the main thread is inside
`Event.wait` (holding the event's internal lock) still stops `pdserve up`."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from services.launcher.stop_signals import stop_on_signals

REPO_ROOT = Path(__file__).resolve().parents[2]

# The worst moment for a handler that calls Event.set(): the main thread holds the event's
# lock when the signal arrives. A handler that takes that lock never returns.
SIGNAL_WHILE_THE_LOCK_IS_HELD = """
import os, signal, threading
from services.launcher.stop_signals import stop_on_signals
stop_event = threading.Event()
with stop_on_signals(stop_event):
    with stop_event._cond:  # white box: the lock Event.wait holds between its bytecodes
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, on this thread
        for _ in range(1000):
            pass
    assert stop_event.wait(30), "SIGTERM did not set the event"
print("stopped")
"""


def test_a_signal_while_the_main_thread_holds_the_events_lock_still_stops():
    finished = subprocess.run([sys.executable, "-c", SIGNAL_WHILE_THE_LOCK_IS_HELD], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=60)
    assert (finished.returncode, finished.stdout.strip()) == (0, "stopped"), finished.stderr


def test_sigint_and_sigterm_set_the_event_and_the_old_handlers_come_back():
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in (signal.SIGINT, signal.SIGTERM):
        stop_event = threading.Event()
        with stop_on_signals(stop_event):
            os.kill(os.getpid(), signum)
            assert stop_event.wait(30)
    assert {signum: signal.getsignal(signum) for signum in before} == before
    assert not any(thread.name == "stop-signals" for thread in threading.enumerate())
