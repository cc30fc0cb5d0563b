"""The event loop that every UCX transfer of this process runs on, in a thread of its own.

ucxx serves one event loop per process (shared.kv_transfer.ucx.env), and the engine that owns a
KV connector may have no event loop at all (an engine-core process). So connectors share one
loop thread: the first `acquire` starts it, the last `release` stops it and tears ucxx down,
so a later user (a test's next instance) starts afresh.
"""

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

CALL_TIMEOUT_S = 30.0

_lock = threading.Lock()
_users = 0
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def acquire() -> asyncio.AbstractEventLoop:
    """The transfer loop, started if needed; pair every call with `release`."""
    global _users, _loop, _thread
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            _thread = threading.Thread(target=_loop.run_forever, name="kv-transfer", daemon=True)
            _thread.start()
        _users += 1
        return _loop


def release() -> None:
    """The last user gone: stop the loop and tear ucxx down (every endpoint is closed by then)."""
    global _users, _loop, _thread
    with _lock:
        _users -= 1
        if _users > 0 or _loop is None:
            return
        loop, thread, _loop, _thread = _loop, _thread, None, None
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=CALL_TIMEOUT_S)
        loop.close()
        from shared.kv_transfer.ucx.env import stop_ucx
        stop_ucx()


def run(loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, Any], timeout_s: float = CALL_TIMEOUT_S):
    """Run `coroutine` on the transfer loop and wait for its result (from another thread)."""
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout_s)
