"""Streaming load that runs until told to stop: `concurrency` greedy gRPC streams, each worker
starting its next request when the last one ends, so a scale event or a rolling upgrade that
takes minutes happens under load from start to end (benchmarks.fault_load records each)."""

import threading

from benchmarks.fault_load import StreamingLoad, StreamResult


class LoadUntilStopped(StreamingLoad):
    def __init__(self, stub, concurrency: int, **load_args):
        super().__init__(stub, 0, concurrency, **load_args)
        self._concurrency = concurrency
        self._stopping = threading.Event()

    def __enter__(self) -> "LoadUntilStopped":
        self._futures = [self._pool.submit(self._worker) for _ in range(self._concurrency)]
        return self

    def __exit__(self, *exc_info) -> None:
        self._stopping.set()
        super().__exit__(*exc_info)

    def _worker(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                result = StreamResult(len(self._results))
                self._results.append(result)
            self._run(result)

    def num_finished(self) -> int:
        with self._lock:
            return sum(1 for result in self._results if result.ended_at)

    def stop(self) -> list[StreamResult]:
        """Start no more requests; every running one ends; all of them, in start order."""
        self._stopping.set()
        return self.results()


def lost(results: list[StreamResult], max_tokens: int) -> list[StreamResult]:
    """Requests that failed or ended short of their `max_tokens` (EOS is ignored)."""
    return [r for r in results if not r.is_ok or len(r.token_ids) != max_tokens]
