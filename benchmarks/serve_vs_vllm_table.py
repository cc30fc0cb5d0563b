"""The table `python -m benchmarks.serve_vs_vllm` prints: per request rate, each server's
figures, then each pdserve server against vLLM, with issue 23's serving targets (pdserve's
TTFT p99 <= 1.0x vLLM's, ITL p99 <= 0.5x, output tok/s >= 1.0x; the issue states them at 4
req/s, the verdict is printed at every rate), then goodput (serve_goodput.py)."""

import math
from collections.abc import Callable
from dataclasses import dataclass

from services.bench.metrics import BenchSummary
from services.bench.runner import RunResult
from benchmarks.serve_goodput import GoodputSLO, goodput_lines

BASELINE = "vllm"
ITL_P99_TARGET = 0.5
TTFT_P99_TARGET = 1.0
THROUGHPUT_TARGET = 1.0


@dataclass(frozen=True)
class Column:
    name: str
    value_of: Callable[[BenchSummary], float]


COLUMNS = (
    Column("out tok/s", lambda s: s.output_throughput),
    Column("TTFT p50", lambda s: s.ttft.percentiles_ms["p50"]),
    Column("TTFT p99", lambda s: s.ttft.percentiles_ms["p99"]),
    Column("ITL p50", lambda s: s.itl.percentiles_ms["p50"]),
    Column("ITL p99", lambda s: s.itl.percentiles_ms["p99"]),
    # The longest stall a stream saw: a few multi-second stalls hide below p99 of thousands of gaps.
    Column("ITL max", lambda s: s.itl.percentiles_ms.get("p100", math.nan)),
)


def ratio(ours: float, theirs: float) -> float:
    """ours / theirs; nan when either is missing or theirs is 0."""
    if theirs == 0 or math.isnan(ours) or math.isnan(theirs):
        return math.nan
    return ours / theirs


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}"


def _times(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def _figure_row(rate: float, server: str, summary: BenchSummary) -> str:
    cells = [f"{rate:g}", server] + [_number(column.value_of(summary)) for column in COLUMNS]
    return "| " + " | ".join(cells + [f"{summary.num_completed}/{summary.num_failed}"]) + " |"


def _ratio_row(rate: float, server: str, ours: BenchSummary, theirs: BenchSummary) -> str:
    cells = [f"{rate:g}", f"**{server} / {BASELINE}**"]
    cells += [_times(ratio(column.value_of(ours), column.value_of(theirs))) for column in COLUMNS]
    return "| " + " | ".join(cells + [""]) + " |"


def target_lines(series: dict[str, list[RunResult]], rates: list[float]) -> list[str]:
    """One line per (rate, pdserve server): its ITL p99 and TTFT p99 ratios against the targets."""
    if BASELINE not in series:
        return []
    lines = []
    for index, rate in enumerate(rates):
        theirs = series[BASELINE][index].summary
        for server, runs in series.items():
            if server == BASELINE:
                continue
            ours = runs[index].summary
            itl = ratio(ours.itl.percentiles_ms["p99"], theirs.itl.percentiles_ms["p99"])
            ttft = ratio(ours.ttft.percentiles_ms["p99"], theirs.ttft.percentiles_ms["p99"])
            tokens = ratio(ours.output_throughput, theirs.output_throughput)
            lines.append(f"- {rate:g} req/s, {server}: TTFT p99 {_times(ttft)} of vLLM's "
                         f"(target <= {TTFT_P99_TARGET}x: {_verdict(ttft, TTFT_P99_TARGET)}), ITL p99 {_times(itl)} "
                         f"(target <= {ITL_P99_TARGET}x: {_verdict(itl, ITL_P99_TARGET)}), output tok/s "
                         f"{_times(tokens)} (target >= {THROUGHPUT_TARGET}x: {_verdict(tokens, THROUGHPUT_TARGET, True)})")
    return lines


def _verdict(value: float, target: float, at_least: bool = False) -> str:
    if math.isnan(value):
        return "no figure"
    return "met" if (value >= target if at_least else value <= target) else "not met"


def format_table(series: dict[str, list[RunResult]], rates: list[float], slo: GoodputSLO | None = None) -> str:
    """Markdown: a row per (rate, server) in run order, then a ratio row per pdserve server
    when vLLM ran (below 1 is better for latencies, above 1 for throughput), then the targets,
    then goodput under `slo` (defaults)."""
    header = ["rate (req/s)", "server"] + [column.name for column in COLUMNS] + ["ok/failed"]
    lines = ["latencies in ms", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for index, rate in enumerate(rates):
        for server, runs in series.items():
            lines.append(_figure_row(rate, server, runs[index].summary))
        if BASELINE in series:
            theirs = series[BASELINE][index].summary
            lines += [_ratio_row(rate, server, runs[index].summary, theirs)
                      for server, runs in series.items() if server != BASELINE]
    targets = target_lines(series, rates)
    return "\n".join(lines + ([""] + targets if targets else []) + [""] + goodput_lines(series, slo or GoodputSLO()))
