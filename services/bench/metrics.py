"""Latency and throughput figures from RequestRecords, with vLLM's `bench serve` definitions.

Per request: TTFT = first token's arrival; e2e = end of the stream; TPOT = (e2e - TTFT) /
(output tokens - 1); ITL = the gaps between streamed messages, a message carrying k tokens
giving k gaps of gap/k each. Throughputs divide by the benchmark's duration; goodput counts
only the successful requests that met every SLO. Called by runner.run_benchmark.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from services.bench.records import RequestRecord
from shared.errors import ConfigurationError

SLO_METRICS = ("ttft", "tpot", "e2el")
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
MAX_ERRORS_KEPT = 5


def ttft_s(record: RequestRecord) -> float:
    return record.chunk_times_s[0]


def e2e_s(record: RequestRecord) -> float:
    return record.end_s


def tpot_s(record: RequestRecord) -> float | None:
    """None for a request with a single output token (no time per *further* token)."""
    if record.num_output_tokens < 2:
        return None
    return (record.end_s - record.chunk_times_s[0]) / (record.num_output_tokens - 1)


def itls_s(record: RequestRecord) -> list[float]:
    """One inter-token latency per token after the first message's."""
    gaps = []
    for position in range(1, len(record.chunk_times_s)):
        gap = record.chunk_times_s[position] - record.chunk_times_s[position - 1]
        num_tokens = record.chunk_num_tokens[position]
        gaps += [gap / num_tokens] * num_tokens
    return gaps


def parse_goodput(items: list[str]) -> dict[str, float]:
    """`["ttft:1000", "tpot:100"]` (milliseconds) -> {"ttft": 1.0, "tpot": 0.1} (seconds)."""
    slos = {}
    for item in items:
        name, _, value = item.partition(":")
        if name not in SLO_METRICS:
            raise ConfigurationError("goodput", f"unknown metric {name!r} (use {', '.join(SLO_METRICS)})")
        try:
            slos[name] = float(value) / 1000.0
        except ValueError:
            raise ConfigurationError("goodput", f"{item!r} needs NAME:MILLISECONDS") from None
    return slos


def meets_slos(record: RequestRecord, slos: dict[str, float]) -> bool:
    values = {"ttft": ttft_s(record), "tpot": tpot_s(record) or 0.0, "e2el": e2e_s(record)}
    return all(values[name] <= limit for name, limit in slos.items())


@dataclass
class LatencyStats:
    """Mean and percentiles (milliseconds) of one latency metric; NaN when there is no sample."""

    mean_ms: float
    percentiles_ms: dict[str, float]

    @classmethod
    def of(cls, values_s: list[float], percentiles: tuple[float, ...]) -> "LatencyStats":
        if not values_s:
            return cls(math.nan, {f"p{p:g}": math.nan for p in percentiles})
        values_ms = np.asarray(values_s) * 1000.0
        return cls(float(values_ms.mean()),
                   {f"p{p:g}": float(np.percentile(values_ms, p)) for p in percentiles})


@dataclass
class BenchSummary:
    duration_s: float
    num_completed: int
    num_failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    # Requests/s that met every SLO in `goodput_slos_ms` (None when no SLO was given).
    request_goodput: float | None
    goodput_slos_ms: dict[str, float]
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats
    first_errors: list[str] = field(default_factory=list)


def summarize(records: list[RequestRecord], duration_s: float, slos: dict[str, float] | None = None,
              percentiles: tuple[float, ...] = DEFAULT_PERCENTILES) -> BenchSummary:
    """The summary of one run whose requests took `duration_s` from first send to last end."""
    slos = slos or {}
    done = [record for record in records if record.is_success]
    failed = [record for record in records if not record.is_success]
    num_input = sum(record.prompt_len for record in done)
    num_output = sum(record.num_output_tokens for record in done)
    num_good = sum(meets_slos(record, slos) for record in done)
    tpots = [value for value in map(tpot_s, done) if value is not None]
    return BenchSummary(
        duration_s=duration_s, num_completed=len(done), num_failed=len(failed),
        total_input_tokens=num_input, total_output_tokens=num_output,
        request_throughput=len(done) / duration_s, output_throughput=num_output / duration_s,
        total_token_throughput=(num_input + num_output) / duration_s,
        request_goodput=num_good / duration_s if slos else None,
        goodput_slos_ms={name: limit * 1000.0 for name, limit in slos.items()},
        ttft=LatencyStats.of([ttft_s(record) for record in done], percentiles),
        tpot=LatencyStats.of(tpots, percentiles),
        itl=LatencyStats.of([gap for record in done for gap in itls_s(record)], percentiles),
        e2el=LatencyStats.of([e2e_s(record) for record in done], percentiles),
        first_errors=[record.error or "empty stream" for record in failed][:MAX_ERRORS_KEPT],
    )
