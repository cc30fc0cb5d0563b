"""Shutting UCX down at process exit, after every receiver and sender has been closed."""

import logging

logger = logging.getLogger(__name__)


def reset_ucx() -> None:
    """Tear down ucxx's process-wide context (it is bound to the event loop that created it).

    ucxx clears its context even when something still references it (it then raises): a
    finished receive whose exception keeps a closed endpoint alive, for example. That is
    harmless at exit, and the next user gets a fresh context either way, so it is only noted.
    """
    from shared.transfer.ucx_env import ucxx
    try:
        ucxx.reset()
    except Exception as error:  # noqa: BLE001 - exiting anyway
        logger.info("UCX context still referenced at reset (closed endpoints): %s", str(error).splitlines()[0])
