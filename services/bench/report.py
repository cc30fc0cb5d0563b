"""Text and JSON output of benchmark runs.

`format_summary` is what `pdserve bench serve` prints after each run; `result_document`
is what `--result-json` writes: the configuration, then per run its summary and every
request's record (so any figure can be recomputed later).
"""

import dataclasses
import json
import math
from pathlib import Path

from services.bench.metrics import BenchSummary, LatencyStats
from services.bench.runner import RunResult

LATENCY_NAMES = (("ttft", "Time to first token"), ("tpot", "Time per output token (excl. 1st)"),
                 ("itl", "Inter-token latency"), ("e2el", "End-to-end latency"))


def format_summary(title: str, summary: BenchSummary) -> str:
    """A vLLM-style block: counts, throughputs, goodput, then each latency's mean and percentiles."""
    lines = [f"{'=' * 20} {title} {'=' * 20}",
             f"{'Successful requests:':<40}{summary.num_completed}",
             f"{'Failed requests:':<40}{summary.num_failed}",
             f"{'Benchmark duration (s):':<40}{summary.duration_s:.2f}",
             f"{'Total input tokens:':<40}{summary.total_input_tokens}",
             f"{'Total generated tokens:':<40}{summary.total_output_tokens}",
             f"{'Request throughput (req/s):':<40}{summary.request_throughput:.2f}",
             f"{'Output token throughput (tok/s):':<40}{summary.output_throughput:.1f}",
             f"{'Total token throughput (tok/s):':<40}{summary.total_token_throughput:.1f}"]
    if summary.request_goodput is not None:
        slos = " ".join(f"{name}<={limit:g}ms" for name, limit in summary.goodput_slos_ms.items())
        lines.append(f"{f'Request goodput ({slos}):':<40}{summary.request_goodput:.2f}")
    for key, name in LATENCY_NAMES:
        lines += _latency_lines(name, getattr(summary, key))
    lines += [f"first error: {error}" for error in summary.first_errors]
    return "\n".join(lines)


def _latency_lines(name: str, stats: LatencyStats) -> list[str]:
    lines = [f"{'-' * 12} {name} {'-' * 12}", f"{'  mean (ms):':<40}{stats.mean_ms:.2f}"]
    lines += [f"{f'  {label} (ms):':<40}{value:.2f}" for label, value in stats.percentiles_ms.items()]
    return lines


def run_document(run: RunResult) -> dict:
    """One run as plain JSON data (NaN becomes null)."""
    return _without_nan({"label": run.label, "load": dataclasses.asdict(run.load),
                         "summary": dataclasses.asdict(run.summary),
                         "requests": [dataclasses.asdict(record) for record in run.records]})


def result_document(config: dict, runs: list[RunResult]) -> dict:
    return {"config": _without_nan(config), "runs": [run_document(run) for run in runs]}


def write_result_json(path: Path, config: dict, runs: list[RunResult], with_requests: bool = True) -> None:
    """`with_requests=False` leaves the per-request records out (a small file to commit)."""
    document = result_document(config, runs)
    if not with_requests:
        for run in document["runs"]:
            del run["requests"]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")


def _without_nan(value):
    if isinstance(value, float):
        return None if math.isnan(value) else ("inf" if math.isinf(value) else value)
    if isinstance(value, dict):
        return {key: _without_nan(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_nan(item) for item in value]
    return value
