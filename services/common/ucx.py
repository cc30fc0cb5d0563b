"""Shutting UCX down at process exit, after every receiver and sender has been closed."""

import logging

logger = logging.getLogger(__name__)


def reset_ucx() -> None:
    """Tear down ucxx's process-wide context (it is bound to the event loop that created it)."""
    from shared.transfer.ucx_env import ucxx
    try:
        ucxx.reset()
    except Exception as error:  # noqa: BLE001 - exiting anyway
        logger.warning("UCX reset failed: %r", error)
