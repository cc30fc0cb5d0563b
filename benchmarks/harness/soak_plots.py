"""PNG figures of a soak run: RSS of every process over time, and TTFT/ITL percentiles per interval."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.harness.soak_report import MIB, IntervalLatency, process_names  # noqa: E402
from benchmarks.harness.soak_samples import MemorySample  # noqa: E402


def plot_rss(samples: list[MemorySample], warmup_s: float, path: Path, title: str = "") -> Path:
    figure, axis = plt.subplots(figsize=(9, 4.5))
    for process in process_names(samples):
        present = [s for s in samples if process in s.rss_bytes]
        axis.plot([s.elapsed_s / 60 for s in present], [s.rss_bytes[process] / MIB for s in present], label=process)
    axis.axvline(warmup_s / 60, color="grey", linestyle="--", linewidth=1, label="end of warm-up")
    axis.set(xlabel="minutes", ylabel="RSS (MiB)", title=title or "Resident memory per process")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    return _save(figure, path)


def plot_latency(rows: list[IntervalLatency], path: Path, title: str = "") -> Path:
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    minutes = [r.start_min for r in rows]
    for axis, name, p50, p99 in ((axes[0], "TTFT", "ttft_p50_ms", "ttft_p99_ms"),
                                 (axes[1], "ITL", "itl_p50_ms", "itl_p99_ms")):
        axis.plot(minutes, [getattr(r, p50) for r in rows], marker="o", label="p50")
        axis.plot(minutes, [getattr(r, p99) for r in rows], marker="o", label="p99")
        axis.set(xlabel="minute of the run (request start)", ylabel="ms", title=f"{name} per interval")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def _save(figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
