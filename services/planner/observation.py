"""What the planner sees each interval: the offered load and the pools' state."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Observation:
    """One interval's measurements (rates over the interval, levels at its end)."""

    request_rate: float = 0.0  # requests/s arriving at the gateways
    mean_prompt_tokens: float = 0.0  # of requests completed in the interval
    mean_output_tokens: float = 0.0
    prefix_hit_ratio: float | None = None  # cached / prompt tokens on prefill instances (None: no data)
    prefill_queue_depth: int = 0  # prompts waiting on prefill instances, summed
    decode_running: int = 0  # sequences decoding, summed over decode instances
    decode_queue_depth: int = 0  # reserved or waiting on decode instances, summed
    kv_usage: float = 0.0  # used / total KV blocks over decode instances
    ttft_p90_s: float | None = None  # as the gateways saw it (None: no requests)
    itl_p90_s: float | None = None
    num_prefill: int = 0  # live instances in Redis
    num_decode: int = 0

    def as_log_fields(self) -> dict[str, float | int | None]:
        return {name: (round(value, 4) if isinstance(value, float) else value)
                for name, value in self.__dict__.items()}
