"""RequestLatencyTracker: request latencies as the engine sees them, as real histograms.

Plugged into the engine client as its OutputObserver, so every hook runs on its event loop:
  arrival          the request's arrival at the engine client (its stream opening; Reserve
                   on a decode instance)
  queue time       arrival -> the first step that scheduled it (not on a decode instance,
                   whose prompt is computed elsewhere)
  time to first    arrival -> the first output carrying a token (on a decode instance, the
  token            prefill's token arriving with Decode: prefill + KV transfer as seen there)
  inter-token      between consecutive outputs of a completion that carry tokens
  e2e              arrival -> the final output
It also counts finished requests by reason and logs the lifecycle (request ids, counts and
timings; never text).
"""

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

from shared.engine_api.outputs import RequestOutput
from shared.metrics.buckets import ITL_BUCKETS_S, REQUEST_BUCKETS_S, TOKEN_COUNT_BUCKETS, TTFT_BUCKETS_S

logger = logging.getLogger(__name__)


@dataclass
class _Timing:
    arrival_time: float | None = None  # from the request's first output
    first_token_time: float | None = None
    last_token_time_by_index: dict[int, float] = field(default_factory=dict)


class RequestLatencyTracker:
    def __init__(self, registry: CollectorRegistry, labels: Mapping[str, str]):
        names, values = list(labels), dict(labels)

        def histogram(name: str, documentation: str, buckets) -> Histogram:
            return Histogram(name, documentation, names, registry=registry, buckets=buckets).labels(**values)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first token, seconds.", TTFT_BUCKETS_S)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Between consecutive token outputs, seconds.",
                             ITL_BUCKETS_S)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to final output, seconds.",
                             REQUEST_BUCKETS_S)
        self.queue = histogram("vllm:request_queue_time_seconds", "Arrival to first scheduled, seconds.",
                               REQUEST_BUCKETS_S)
        self.prompt_tokens = histogram("vllm:request_prompt_tokens", "Prompt tokens per finished request.",
                                       TOKEN_COUNT_BUCKETS)
        self.generation_tokens = histogram("vllm:request_generation_tokens",
                                           "Generated tokens per finished completion.", TOKEN_COUNT_BUCKETS)
        self._success = Counter("vllm:request_success", "Finished completions, by finish reason.",
                                [*names, "finished_reason"], registry=registry)
        self._labels = values
        self._timings: dict[str, _Timing] = {}

    def on_start(self, request_id: str) -> None:
        self._timings[request_id] = _Timing()

    def on_outputs(self, outputs: list[RequestOutput]) -> None:
        now = time.monotonic()
        for output in outputs:
            timing = self._timings.get(output.request_id)
            if timing is not None:
                self._observe(output, timing, now)

    def on_stop(self, request_id: str) -> None:
        """A stream that closed before its final output: the request was aborted."""
        if self._timings.pop(request_id, None) is not None:
            self._count_finish("abort")
            logger.info("request %s aborted", request_id, extra={"request_id": request_id})

    def _observe(self, output: RequestOutput, timing: _Timing, now: float) -> None:
        if timing.arrival_time is None:
            timing.arrival_time = output.arrival_time or now
        completions_with_tokens = [c for c in output.outputs if c.delta_token_ids]
        if completions_with_tokens and timing.first_token_time is None:
            self._first_token(output, timing, now)
        for completion in completions_with_tokens:
            last = timing.last_token_time_by_index.get(completion.index)
            if last is not None:
                self.itl.observe(now - last)
            timing.last_token_time_by_index[completion.index] = now
        if output.finished:
            self._finish(output, timing, now)

    def _first_token(self, output: RequestOutput, timing: _Timing, now: float) -> None:
        request_id = output.request_id
        timing.first_token_time = now
        ttft_s = now - timing.arrival_time
        self.ttft.observe(ttft_s)
        first_scheduled = output.first_scheduled_time
        if first_scheduled is not None:
            self.queue.observe(max(0.0, first_scheduled - timing.arrival_time))
        logger.info("request %s first token after %.1f ms", request_id, ttft_s * 1e3,
                    extra={"request_id": request_id, "ttft_ms": round(ttft_s * 1e3, 3)})

    def _finish(self, output: RequestOutput, timing: _Timing, now: float) -> None:
        del self._timings[output.request_id]
        e2e_s = now - timing.arrival_time
        self.e2e.observe(e2e_s)
        self.prompt_tokens.observe(len(output.prompt_token_ids))
        for completion in output.outputs:
            self.generation_tokens.observe(len(completion.token_ids))
            self._count_finish(completion.finish_reason)
        reasons = ",".join(sorted({c.finish_reason for c in output.outputs}))
        num_generated = sum(len(c.token_ids) for c in output.outputs)
        logger.info("request %s finished (%s): %d prompt tokens (%d cached), %d generated, %.1f ms",
                    output.request_id, reasons, len(output.prompt_token_ids), output.num_cached_tokens,
                    num_generated, e2e_s * 1e3,
                    extra={"request_id": output.request_id, "finish_reason": reasons,
                           "num_prompt_tokens": len(output.prompt_token_ids),
                           "num_cached_prompt_tokens": output.num_cached_tokens,
                           "num_generated_tokens": num_generated, "e2e_ms": round(e2e_s * 1e3, 3)})

    def _count_finish(self, reason: str | None) -> None:
        self._success.labels(**self._labels, finished_reason=reason or "unknown").inc()
