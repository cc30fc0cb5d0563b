"""PNG figures of benchmark runs (matplotlib, Agg backend: no display needed).

`plot_latency_cdfs` draws the TTFT, ITL and e2e latency CDFs of several labelled runs side by
side; `plot_rate_sweep` draws output throughput, p99 TTFT and p99 ITL against the request
rate, one line per series (e.g. colocated vs disaggregated). Called after the runs, by the
bench command (`--plot-dir`) and benchmarks/serve_compare.py.
"""

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from services.bench.metrics import e2e_s, itls_s, ttft_s  # noqa: E402
from services.bench.runner import RunResult  # noqa: E402

CDF_METRICS = (("TTFT", lambda r: [ttft_s(r)]), ("ITL", itls_s), ("E2E latency", lambda r: [e2e_s(r)]))


def plot_latency_cdfs(runs: list[RunResult], path: Path, title: str = "") -> Path:
    """One panel per metric, one CDF line per run (labelled by run.label)."""
    figure, axes = plt.subplots(1, len(CDF_METRICS), figsize=(15, 4.2))
    for axis, (name, values_of) in zip(axes, CDF_METRICS):
        for run in runs:
            values_ms = np.sort([v * 1000 for r in run.records if r.is_success for v in values_of(r)])
            if len(values_ms):
                axis.plot(values_ms, np.arange(1, len(values_ms) + 1) / len(values_ms), label=run.label)
        axis.set(title=f"{name} CDF", xlabel="ms", ylabel="fraction of samples")
        axis.set_xscale("log")
        axis.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on a log axis
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    return _save(figure, path, title)


def plot_rate_sweep(series: dict[str, list[RunResult]], path: Path, title: str = "") -> Path:
    """Output tok/s, p99 TTFT and p99 ITL against the offered request rate, per series."""
    panels = (("output tok/s", lambda s: s.output_throughput),
              ("p99 TTFT (ms)", lambda s: s.ttft.percentiles_ms["p99"]),
              ("p99 ITL (ms)", lambda s: s.itl.percentiles_ms["p99"]))
    figure, axes = plt.subplots(1, len(panels), figsize=(15, 4.2))
    for axis, (name, value_of) in zip(axes, panels):
        for label, runs in series.items():
            rates = [_plotted_rate(run.load.request_rate, series) for run in runs]
            axis.plot(rates, [value_of(run.summary) for run in runs], marker="o", label=label)
        axis.set(title=name, xlabel="request rate (req/s)", ylabel=name)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    return _save(figure, path, title)


def _plotted_rate(rate: float, series: dict[str, list[RunResult]]) -> float:
    """An infinite rate is drawn at twice the largest finite one."""
    if not math.isinf(rate):
        return rate
    finite = [run.load.request_rate for runs in series.values() for run in runs
              if not math.isinf(run.load.request_rate)]
    return 2 * max(finite, default=1.0)


def _save(figure, path: Path, title: str) -> Path:
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
