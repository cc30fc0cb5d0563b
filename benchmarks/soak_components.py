"""Where a soak's memory went: for each instance, every `pdserve:memory_bytes{component}` (and
glibc's arena count) at the end of the warm-up and at the end of the load, and its slope in
MiB/min, from a `make bench-soak` run's samples.json.

    python -m benchmarks.soak_components bench-results/soak/samples.json --warmup-minutes 5
"""

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.harness.soak_report import MIB


def component_rows(samples: list[dict], warmup_s: float, end_s: float) -> list[str]:
    """Markdown rows: process, component, MiB at the warm-up's end, MiB at the end, MiB/min."""
    rows = []
    window = [s for s in samples if warmup_s <= s["elapsed_s"] <= end_s]
    for process in dict.fromkeys(name for s in window for name in s["components"]):
        present = [s for s in window if s["components"].get(process)]
        for component in present[0]["components"][process] if present else ():
            points = [(s["elapsed_s"] / 60, s["components"][process].get(component)) for s in present]
            points = [(t, v) for t, v in points if v is not None]
            scale = 1 if component == "malloc_arenas" else MIB
            times, values = np.array([t for t, _ in points]), np.array([v / scale for _, v in points])
            slope = float(np.polyfit(times, values, 1)[0]) if len(points) >= 2 else float("nan")
            rows.append(f"| {process} | {component} | {values[0]:.0f} | {values[-1]:.0f} | {slope:.2f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", type=Path)
    parser.add_argument("--warmup-minutes", type=float, default=2.0)
    parser.add_argument("--minutes", type=float, default=float("inf"), help="end of the load (default: all samples)")
    args = parser.parse_args()
    samples = json.loads(args.samples.read_text())
    print("| process | component | after warm-up MiB | end MiB | MiB/min |\n| --- | --- | --- | --- | --- |")
    print("\n".join(component_rows(samples, args.warmup_minutes * 60, args.minutes * 60)))


if __name__ == "__main__":
    main()
