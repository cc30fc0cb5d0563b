"""The one table `make bench` prints: per request rate, each mode's figures and the
disaggregated/colocated ratio (below 1 is better for latencies, above 1 for throughput)."""

import math

from services.bench.metrics import BenchSummary
from services.bench.runner import RunResult

COLUMNS = (
    ("out tok/s", lambda s: s.output_throughput, "{:.0f}"),
    ("TTFT p50", lambda s: s.ttft.percentiles_ms["p50"], "{:.0f}"),
    ("TTFT p99", lambda s: s.ttft.percentiles_ms["p99"], "{:.0f}"),
    ("ITL p50", lambda s: s.itl.percentiles_ms["p50"], "{:.0f}"),
    ("ITL p99", lambda s: s.itl.percentiles_ms["p99"], "{:.0f}"),
    ("TPOT p99", lambda s: s.tpot.percentiles_ms["p99"], "{:.0f}"),
    ("goodput", lambda s: s.request_goodput if s.request_goodput is not None else math.nan, "{:.2f}"),
    ("ok/failed", None, None),
)


def _cells(summary: BenchSummary) -> list[str]:
    cells = [fmt.format(value_of(summary)) for _, value_of, fmt in COLUMNS[:-1]]
    return cells + [f"{summary.num_completed}/{summary.num_failed}"]


def _ratio_cells(ours: BenchSummary, base: BenchSummary) -> list[str]:
    cells = []
    for _, value_of, _ in COLUMNS[:-1]:
        mine, theirs = value_of(ours), value_of(base)
        cells.append(f"{mine / theirs:.2f}x" if theirs and not math.isnan(theirs) else "-")
    return cells + [""]


def format_compare_table(series: dict[str, list[RunResult]], rates: list[float]) -> str:
    """A Markdown table: one row per (rate, mode), then the ratio row when both modes ran.
    Latencies in ms; goodput in requests/s meeting the SLOs."""
    slos = next(iter(series.values()))[0].summary.goodput_slos_ms
    slo_text = ", ".join(f"{name}<={limit:g} ms" for name, limit in slos.items())
    header = ["rate (req/s)", "mode"] + [name for name, _, _ in COLUMNS]
    lines = [f"latencies in ms; goodput = requests/s meeting {slo_text}",
             "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for index, rate in enumerate(rates):
        for mode, runs in series.items():
            lines.append("| " + " | ".join([f"{rate:g}", mode] + _cells(runs[index].summary)) + " |")
        if {"colocated", "disaggregated"} <= series.keys():
            ratio = _ratio_cells(series["disaggregated"][index].summary, series["colocated"][index].summary)
            lines.append("| " + " | ".join([f"{rate:g}", "**disagg/coloc**"] + ratio) + " |")
    return "\n".join(lines)
