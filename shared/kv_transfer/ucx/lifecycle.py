"""Shutting UCX down after every receiver and sender has been closed (at process exit, and in
tests between event loops), and telling whether it runs, without importing ucxx."""

import sys


def ucx_context():
    """ucxx's process-wide context, or None when this process has none (ucxx not imported, or
    reset). The one place that reads ucxx's private `ucxx.core._ctx`: ucxx offers no public way
    to ask whether a context exists without creating one, and `ucxx.reset()` (the only way to
    start afresh on a new event loop) must be called only when one does. Read through
    sys.modules, so a process that never used UCX does not import it here."""
    core = sys.modules.get("ucxx.core")
    return None if core is None else getattr(core, "_ctx", None)


def ucx_is_started() -> bool:
    """Whether this process has a ucxx context now."""
    return ucx_context() is not None


def reset_ucx() -> None:
    """Tear down ucxx's process-wide context (its notifier thread serves the event loop that
    created it) so the next user, on any loop, starts a fresh one. No-op when none exists."""
    if ucx_is_started():
        from shared.kv_transfer.ucx.env import stop_ucx
        stop_ucx()
