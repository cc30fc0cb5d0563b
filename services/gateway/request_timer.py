"""RequestTimer: one request's latencies as its client sees them, and its lifecycle log lines.

generate_stream makes one per request and calls `on_message` for each message it streams to
the client, then `finish` once the stream ends normally. It observes the gateway histograms
(see services.gateway.metrics) and logs "first token" and "finished" with the request id,
token counts and timings, never text.
"""

import logging
import time

from shared.pb.pdserve.v1 import generation_pb2
from shared.wire.outputs import finish_reason_from_proto

from services.gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)


def finish_reason_name(reason: int) -> str:
    """FINISH_REASON_STOP -> "stop"."""
    return finish_reason_from_proto(reason).value


class RequestTimer:
    def __init__(self, metrics: GatewayMetrics | None, model_name: str, request_id: str):
        self.metrics = metrics
        self.model_name = model_name
        self.request_id = request_id
        self.received_at = time.monotonic()
        self.first_token_at: float | None = None
        self.last_token_at_by_index: dict[int, float] = {}
        self.num_generated_tokens = 0
        self.finish_reasons: list[str] = []

    def on_message(self, message: generation_pb2.GenerateResponse) -> None:
        now = time.monotonic()
        if message.finish_reason != generation_pb2.FINISH_REASON_UNSPECIFIED:
            self.finish_reasons.append(finish_reason_name(message.finish_reason))
        if not message.token_ids:
            return
        self.num_generated_tokens += len(message.token_ids)
        if self.first_token_at is None:
            self.first_token_at = now
            self._observe("ttft", now - self.received_at)
            logger.info("request %s first token after %.1f ms", self.request_id, (now - self.received_at) * 1e3,
                        extra={"request_id": self.request_id, "ttft_ms": round((now - self.received_at) * 1e3, 3)})
        last = self.last_token_at_by_index.get(message.index)
        if last is not None:
            self._observe("itl", now - last)
        self.last_token_at_by_index[message.index] = now

    def finish(self, num_prompt_tokens: int) -> None:
        e2e_s = time.monotonic() - self.received_at
        self._observe("e2e", e2e_s)
        if self.metrics is not None:
            self.metrics.prompt_tokens.labels(self.model_name).inc(num_prompt_tokens)
            self.metrics.generation_tokens.labels(self.model_name).inc(self.num_generated_tokens)
        reasons = ",".join(sorted(set(self.finish_reasons))) or "none"
        logger.info("request %s finished (%s): %d prompt tokens, %d generated, %.1f ms", self.request_id, reasons,
                    num_prompt_tokens, self.num_generated_tokens, e2e_s * 1e3,
                    extra={"request_id": self.request_id, "finish_reason": reasons,
                           "num_prompt_tokens": num_prompt_tokens, "num_generated_tokens": self.num_generated_tokens,
                           "e2e_ms": round(e2e_s * 1e3, 3)})

    def _observe(self, histogram: str, seconds: float) -> None:
        if self.metrics is not None:
            getattr(self.metrics, histogram).labels(self.model_name).observe(seconds)
