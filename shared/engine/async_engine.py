"""AsyncEngine: the engine client (shared.engine.frontend) with its core on a thread of this
process (shared.engine.thread_transport): built from an `LLMEngine` that is loaded already.
Tests and offline tools use it, and services with `--engine-core thread`."""

from collections.abc import Callable
from typing import Any

from shared.engine_api.client import EngineDeadError, KVTransferFailedError, OutputObserver, RequestFailedError
from shared.engine.frontend import EngineFrontend
from shared.engine.llm_engine import LLMEngine
from shared.engine.thread_transport import ThreadTransport

__all__ = ["AsyncEngine", "EngineDeadError", "KVTransferFailedError", "OutputObserver", "RequestFailedError"]


class AsyncEngine(EngineFrontend):
    def __init__(self, engine: LLMEngine, observer: OutputObserver | None = None,
                 on_failure: Callable[[BaseException], None] | None = None,
                 on_loop: Callable[[bool], Any] | None = None, num_threads: int | None = None):
        """`on_failure(error)`: see EngineFrontend; `on_loop(is_idle)`: called on the engine
        thread on every loop iteration, with whether it has nothing to run (memory trimming);
        `num_threads`: torch threads of the steps."""
        super().__init__(ThreadTransport(engine.core, on_loop, num_threads), engine.tokenizer, observer, on_failure)
