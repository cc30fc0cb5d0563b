"""The soak benchmark's figures: RSS growth per minute after warm-up (least-squares slope of
the samples) and TTFT/ITL percentiles per interval of request start times."""

from dataclasses import dataclass

import numpy as np

from services.bench.metrics import itls_s, ttft_s
from benchmarks.harness.soak_load import SoakRecord
from benchmarks.harness.soak_samples import MemorySample

MIB = 1 << 20


@dataclass(frozen=True)
class RssGrowth:
    process: str
    start_mib: float
    warm_mib: float  # at the end of the warm-up
    end_mib: float
    mib_per_minute: float  # slope after the warm-up


@dataclass(frozen=True)
class IntervalLatency:
    start_min: float
    num_requests: int
    num_errors: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float


def process_names(samples: list[MemorySample]) -> list[str]:
    """Every process seen in any sample, in the order first seen (a child may start late)."""
    return list(dict.fromkeys(name for sample in samples for name in sample.rss_bytes))


def rss_growth(samples: list[MemorySample], warmup_s: float) -> list[RssGrowth]:
    """One row per process, from the samples it appears in; the slope needs at least two
    samples after the warm-up (else the last two)."""
    growth = []
    for process in process_names(samples):
        present = [s for s in samples if process in s.rss_bytes]
        after = [s for s in present if s.elapsed_s >= warmup_s] or present[-2:]
        times = np.array([s.elapsed_s / 60 for s in after])
        values = np.array([s.rss_bytes[process] / MIB for s in after])
        slope = float(np.polyfit(times, values, 1)[0]) if len(after) >= 2 else float("nan")
        growth.append(RssGrowth(process, present[0].rss_bytes[process] / MIB, values[0], values[-1], slope))
    return growth


def _percentile_ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1000) if values else float("nan")


def interval_latencies(records: list[SoakRecord], interval_s: float) -> list[IntervalLatency]:
    """Percentiles of the requests that started in each interval (cancelled ones: TTFT only)."""
    if not records:
        return []
    rows = []
    for start in np.arange(0.0, max(r.start_s for r in records) + 1e-9, interval_s):
        batch = [r for r in records if start <= r.start_s < start + interval_s]
        ok = [r for r in batch if r.is_success]
        ttfts = [ttft_s(r) for r in ok]
        itls = [gap for r in ok if r.kind != "cancelled" for gap in itls_s(r)]
        rows.append(IntervalLatency(start / 60, len(batch), len(batch) - len(ok), _percentile_ms(ttfts, 50),
                                    _percentile_ms(ttfts, 99), _percentile_ms(itls, 50), _percentile_ms(itls, 99)))
    return rows


def growth_table(rows: list[RssGrowth], target_mib_per_min: float) -> str:
    lines = ["| process | start MiB | after warm-up | end | growth after warm-up MiB/min | target |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        verdict = "ok" if row.mib_per_minute < target_mib_per_min else "OVER"
        lines.append(f"| {row.process} | {row.start_mib:.0f} | {row.warm_mib:.0f} | {row.end_mib:.0f} | "
                     f"{row.mib_per_minute:.2f} | {verdict} (< {target_mib_per_min:g}) |")
    return "\n".join(lines)


def latency_table(rows: list[IntervalLatency]) -> str:
    lines = ["| minute | requests | errors | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r.start_min:.0f} | {r.num_requests} | {r.num_errors} | {r.ttft_p50_ms:.0f} | {r.ttft_p99_ms:.0f} | "
              f"{r.itl_p50_ms:.0f} | {r.itl_p99_ms:.0f} |" for r in rows]
    return "\n".join(lines)
