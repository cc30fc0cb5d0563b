"""Imports ucxx after giving UCX our default environment; every ucxx user imports it from here.

UCX and ucxx read their configuration from the environment when the first ucxx context is
created, so defaults must be in place before that. Defaults only fill in what is not set:
  UCX_TLS=tcp,self               TCP between processes (set-up always needs tcp); add `sm` for
                                 shared memory between same-host processes, e.g. "sm,self,tcp".
  UCX_WARN_UNUSED_ENV_VARS=n     no warning about UCX_* variables this UCX build ignores.
  UCXPY_ENABLE_PYTHON_FUTURE=1   ucxx completes requests through a notifier thread. Without it
                                 every pending receive (an idle connection waiting for its next
                                 header) busy-polls the event loop: one full core per process.

The notifier thread serves the event loop that was running when ucxx was first used, so one
process uses ucxx from one event loop at a time (services do anyway; tests run a module-wide
loop): before using ucxx from a new loop, call `stop_ucx()` once the old loop is done. The
thread is not a daemon: its stop is registered to run at interpreter exit.
"""

import logging
import os
import threading

DEFAULT_UCX_ENV = {"UCX_TLS": "tcp,self", "UCX_WARN_UNUSED_ENV_VARS": "n", "UCXPY_ENABLE_PYTHON_FUTURE": "1"}

logger = logging.getLogger(__name__)


def apply_default_ucx_env() -> None:
    """Set each DEFAULT_UCX_ENV variable that is not already set."""
    for name, value in DEFAULT_UCX_ENV.items():
        os.environ.setdefault(name, value)


apply_default_ucx_env()

import ucxx  # noqa: E402  (must follow the environment defaults above)


def stop_ucx() -> None:
    """Tear down ucxx (notifier thread and context) so a later event loop can start it afresh.

    Call after the event loop that used ucxx is finished and every KVSender/KVReceiver is
    closed. If some ucxx object is still alive only the notifier thread is stopped.
    """
    try:
        ucxx.reset()
    except ucxx.exceptions.UCXError as error:
        logger.debug("ucxx.reset() incomplete, stopping the notifier thread only: %s", error)
        ucxx.stop_notifier_thread()


# Runs before the interpreter joins non-daemon threads, unlike `atexit` (CPython 3.9+).
threading._register_atexit(ucxx.stop_notifier_thread)

__all__ = ["DEFAULT_UCX_ENV", "apply_default_ucx_env", "stop_ucx", "ucxx"]
