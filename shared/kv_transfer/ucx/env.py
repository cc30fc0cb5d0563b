"""Imports ucxx after giving UCX our default environment; every ucxx user imports it from here.

UCX and ucxx read their configuration from the environment when the first ucxx context is
created, so defaults must be in place before that. Defaults only fill in what is not set:
  UCX_TLS=tcp,self               TCP between processes (set-up always needs tcp); add `sm` for
                                 shared memory between same-host processes, e.g. "sm,self,tcp".
  UCX_WARN_UNUSED_ENV_VARS=n     no warning about UCX_* variables this UCX build ignores.
  UCXPY_ENABLE_PYTHON_FUTURE=1   ucxx completes requests through a notifier thread. Without it
                                 every pending receive (an idle connection waiting for its next
                                 header) busy-polls the event loop: one full core per process.
  UCX_TCP_CM_REUSEADDR=y         the KV listener binds with SO_REUSEADDR: an instance restarted
                                 on the same address after a kill finds its port's accepted
                                 connections in TIME_WAIT for 60 s, and without it failed to
                                 bind ("Device is busy") until they expired. A port another
                                 process still listens on stays refused.

The notifier thread serves the event loop that was running when ucxx was first used, so one
process uses ucxx from one event loop at a time (services do anyway; tests run a module-wide
loop): before using ucxx from a new loop, call `stop_ucx()` once the old loop is done. The
thread is not a daemon: its stop is registered to run at interpreter exit.
"""

import gc
import logging
import os
import threading
import weakref

from shared.kv_transfer.ucx.lifecycle import ucx_context

DEFAULT_UCX_ENV = {"UCX_TLS": "tcp,self", "UCX_WARN_UNUSED_ENV_VARS": "n", "UCXPY_ENABLE_PYTHON_FUTURE": "1",
                   "UCX_TCP_CM_REUSEADDR": "y"}

logger = logging.getLogger(__name__)


def apply_default_ucx_env() -> None:
    """Set each DEFAULT_UCX_ENV variable that is not already set."""
    for name, value in DEFAULT_UCX_ENV.items():
        os.environ.setdefault(name, value)


apply_default_ucx_env()

import ucxx  # noqa: E402  (must follow the environment defaults above)
from ucxx._lib_async import application_context as _application_context  # noqa: E402
from ucxx._lib_async import continuous_ucx_progress as _continuous_progress  # noqa: E402

# How long the worker's progress thread sleeps in epoll_wait between wake-ups when no event
# arrives. ucxx's async API starts it with 1 ms: ~1,000 wake-ups a second on an idle worker,
# each preempting the engine's forward pass where they share a core (an engine-core process
# pinned to one CPU: 13,000 preemptions of its compute thread a minute, forward passes ~15%
# slower). Every submission signals the worker (delayed submission, on in thread mode), and
# every incoming message is an epoll event, so the timeout is only a safety net.
PROGRESS_EPOLL_TIMEOUT_MS = 100


class QuietThreadMode(_continuous_progress.ThreadMode):
    """ucxx's progress thread (thread mode), waking every PROGRESS_EPOLL_TIMEOUT_MS when idle."""

    def __init__(self, worker, event_loop, polling_mode=False):
        _continuous_progress.ProgressTask.__init__(self, worker, event_loop)
        worker.set_progress_thread_start_callback(_continuous_progress._create_context)
        worker.start_progress_thread(polling_mode=polling_mode, epoll_timeout=PROGRESS_EPOLL_TIMEOUT_MS)
        weakref.finalize(self, worker.stop_progress_thread)


_application_context.ThreadMode = QuietThreadMode


# Contexts whose reset found them still referenced. Each is kept alive on purpose: ucxx gives
# every context a finalizer that clears the process-wide table of progress tasks, so one
# collected later (a log record or a pending operation letting go of it) would also drop the
# *live* context's progress task, and with it its worker's progress thread, mid-transfer.
_STALE_CONTEXTS: list = []


def stop_ucx() -> None:
    """Tear down ucxx (notifier thread and context) so a later event loop can start it afresh.

    Call after the event loop that used ucxx is finished and every KVSender/KVReceiver is
    closed. ucxx clears its context even when something still references it (it then raises:
    a finished receive whose exception keeps a closed endpoint alive, for example); the
    notifier thread is stopped either way, and such a stale context is kept (see above).
    """
    if ucx_context() is None:
        return
    _wake_notifier_for_its_stop(ucx_context())
    context = weakref.ref(ucx_context())  # a strong reference here would fail the reset itself
    gc.collect()  # references held only by cycles (tracebacks, futures) are no reason to fail
    try:
        ucxx.reset()
    except ucxx.exceptions.UCXError as error:
        _STALE_CONTEXTS.append(context())
        logger.info("UCX context still referenced at reset, kept until exit: %s", str(error).splitlines()[0])


def _wake_notifier_for_its_stop(context) -> None:
    """ucxx's notifier thread looks for its stop request only between waits of up to one
    second for a request to finish, so `ucxx.reset()` took a second in every stop of an
    instance, engine core or test. Ending the worker's wait first (the notifier then exits
    at once) lets the reset join a finished thread. Only at the reset: the context goes."""
    if getattr(context, "notifier_thread", None) is not None:
        context.worker.stop_request_notifier_thread()


# Runs before the interpreter joins non-daemon threads, unlike `atexit` (CPython 3.9+).
threading._register_atexit(ucxx.stop_notifier_thread)

__all__ = ["DEFAULT_UCX_ENV", "apply_default_ucx_env", "stop_ucx", "ucxx"]
