"""Ending a service or engine-core process once its own shutdown has run."""

import logging
import os
import sys


def exit_without_teardown(status: int) -> None:
    """Exit with `status` now, skipping the interpreter's teardown: a second or more spent
    freeing torch's and the model's objects one by one, which every stop of an instance (and
    each of its restarts) waited for. Call it only after the process closed what it owns
    (servers, engine, KV connector, UCX) and exported its spans; the logs are flushed here.
    atexit handlers do not run."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
