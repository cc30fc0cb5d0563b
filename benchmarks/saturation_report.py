"""The table `python -m benchmarks.saturation` prints: per burst size, a row per (server, round),
then each server's median over its rounds, then each pdserve server's medians over vLLM's.

A burst's figures: requests completed and failed (and of the failed, how many the server
refused with HTTP 429), output and total (prompt + output) tokens/s over the burst's duration
(first send to last end), TTFT p50/p99 and ITL p50/p99 in milliseconds.
"""

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from services.bench.runner import RunResult
from benchmarks.serve_vs_vllm_table import BASELINE, ratio

REFUSED_PREFIX = "HTTP 429"


def num_refused(run: RunResult) -> int:
    """Requests the server refused with 429 (too busy); the client records them as `HTTP 429: ...`."""
    return sum(1 for record in run.records if (record.error or "").startswith(REFUSED_PREFIX))


@dataclass(frozen=True)
class Figure:
    name: str
    value_of: Callable[[RunResult], float]
    is_count: bool = False


FIGURES = (
    Figure("ok", lambda run: run.summary.num_completed, is_count=True),
    Figure("failed", lambda run: run.summary.num_failed, is_count=True),
    Figure("429", num_refused, is_count=True),
    Figure("out tok/s", lambda run: run.summary.output_throughput),
    Figure("total tok/s", lambda run: run.summary.total_token_throughput),
    Figure("TTFT p50", lambda run: run.summary.ttft.percentiles_ms["p50"]),
    Figure("TTFT p99", lambda run: run.summary.ttft.percentiles_ms["p99"]),
    Figure("ITL p50", lambda run: run.summary.itl.percentiles_ms["p50"]),
    Figure("ITL p99", lambda run: run.summary.itl.percentiles_ms["p99"]),
)


def median_over_rounds(values: list[float]) -> float:
    """The median of the rounds that have the figure (a round with no completed request has no
    TTFT); nan when none has it."""
    present = [value for value in values if not math.isnan(value)]
    return statistics.median(present) if present else math.nan


def median_figures(runs: list[RunResult]) -> list[float]:
    """Each figure of FIGURES, as its median over `runs` (one per round)."""
    return [median_over_rounds([float(figure.value_of(run)) for run in runs]) for figure in FIGURES]


def _cell(value: float, is_count: bool) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:g}" if is_count else f"{value:.0f}"


def _row(first_cells: list[str], values: list[float]) -> str:
    cells = first_cells + [_cell(value, figure.is_count) for figure, value in zip(FIGURES, values)]
    return "| " + " | ".join(cells) + " |"


def _ratio_row(burst_size: int, server: str, ours: list[float], theirs: list[float]) -> str:
    cells = [str(burst_size), f"**{server} / {BASELINE}**", "median"]
    cells += ["" if figure.is_count else ("-" if math.isnan(value) else f"{value:.2f}x")
              for figure, value in zip(FIGURES, map(ratio, ours, theirs))]
    return "| " + " | ".join(cells) + " |"


def format_saturation_table(results: dict[str, dict[int, list[RunResult]]], burst_sizes: list[int]) -> str:
    """Markdown. `results[server][burst_size]` holds one run per round, in round order; the
    ratio rows (below 1 is better for latencies, above 1 for throughput) need vLLM's runs."""
    header = ["N", "server", "round"] + [figure.name for figure in FIGURES]
    lines = ["N requests sent at once; latencies in ms; 429 = of the failed, refused as too busy",
             "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for size in burst_sizes:
        for server, by_size in results.items():
            for round_index, run in enumerate(by_size[size]):
                lines.append(_row([str(size), server, str(round_index)], [figure.value_of(run) for figure in FIGURES]))
        medians = {server: median_figures(by_size[size]) for server, by_size in results.items()}
        lines += [_row([str(size), f"**{server}**", "median"], values) for server, values in medians.items()]
        if BASELINE in medians:
            lines += [_ratio_row(size, server, values, medians[BASELINE])
                      for server, values in medians.items() if server != BASELINE]
    return "\n".join(lines)
