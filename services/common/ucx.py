"""Shutting UCX down after every receiver and sender has been closed (at process exit, and in
tests between event loops)."""

import sys


def ucx_is_started() -> bool:
    """Whether this process has a ucxx context now (without importing ucxx)."""
    core = sys.modules.get("ucxx.core")
    return core is not None and getattr(core, "_ctx", None) is not None


def reset_ucx() -> None:
    """Tear down ucxx's process-wide context (its notifier thread serves the event loop that
    created it) so the next user, on any loop, starts a fresh one. No-op when none exists."""
    if ucx_is_started():
        from shared.transfer.ucx_env import stop_ucx
        stop_ucx()
