"""A day-long simulated trace: a diurnal curve (lowest at 04:00, peak at 16:00) through the
simulator, the planner against a fixed P:D sized for the peak (the least-cost one at the
peak rate). Writes a JSON and a plot of the rate and both pools over the day.

    python -m benchmarks.simulate_day --profile docs/autoscaling/profile-smollm2-cpu-fp32.json --peak 16 \
        --prompt-median 128 --ttft-slo 2 --itl-slo 0.2
"""

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from services.planner.config import PlannerConfig, PoolBounds
from services.cost_model.perf_profile import PerfProfile
from services.simulator.cluster import SimConfig
from services.simulator.search import least_cost_ratio, simulate_fixed, simulate_planner
from services.simulator.workload import LengthModel, make_trace


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--peak", type=float, default=1.0, help="req/s at the day's peak")
    parser.add_argument("--prompt-median", type=int, default=256, help="median prompt tokens (before a prefix)")
    parser.add_argument("--output-median", type=int, default=64, help="median output tokens")
    parser.add_argument("--ttft-slo", type=float, default=3.0)
    parser.add_argument("--itl-slo", type=float, default=0.3)
    parser.add_argument("--out", type=Path, default=Path("docs/autoscaling"))
    return parser.parse_args()


def plot(timeline, fixed: tuple[int, int], requests, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = np.array([t for t, *_ in timeline]) / 3600
    figure, (rate_axis, pool_axis) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    arrivals = np.array([r.arrival_s for r in requests]) / 3600
    bins = np.arange(0, 24.25, 0.25)
    rate_axis.plot(bins[:-1] + 0.125, np.histogram(arrivals, bins)[0] / 900)
    rate_axis.set_ylabel("requests/s")
    pool_axis.step(hours, [p for _, p, _, _ in timeline], where="post", label="planner: prefill")
    pool_axis.step(hours, [d for _, _, d, _ in timeline], where="post", label="planner: decode")
    pool_axis.axhline(fixed[0], color="C0", linestyle=":", label=f"fixed: {fixed[0]} prefill")
    pool_axis.axhline(fixed[1], color="C1", linestyle=":", label=f"fixed: {fixed[1]} decode")
    pool_axis.set_ylabel("instances")
    pool_axis.set_xlabel("hour of the day")
    pool_axis.legend(fontsize=8)
    for axis in (rate_axis, pool_axis):
        axis.grid(alpha=0.3)
    figure.suptitle("Simulated day: planner vs fixed P:D sized for the peak")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    args = parse_args()
    profile = PerfProfile.load(args.profile)
    # A day's planner: 30 s intervals, scale-in only after 5 minutes of calm (Poisson noise at
    # ~1 req/s is +-30% over 30 s: shorter settings flap at small pool sizes).
    config = SimConfig(ttft_slo_s=args.ttft_slo, itl_slo_s=args.itl_slo, interval_s=30.0)
    lengths = LengthModel(prompt_median=args.prompt_median, output_median=args.output_median)
    peak = make_trace("poisson", args.peak, 600.0, lengths, seed=1)
    started = time.perf_counter()
    ratio = least_cost_ratio(profile, config, peak, max_per_pool=64)
    search_s = time.perf_counter() - started
    day = make_trace("diurnal", args.peak, 86_400.0, lengths, seed=2)
    fixed = simulate_fixed(profile, config, day, ratio.num_prefill, ratio.num_decode)
    planner_config = PlannerConfig(ttft_slo_s=args.ttft_slo, itl_slo_s=args.itl_slo, prefill=PoolBounds(1, 64),
                                   decode=PoolBounds(1, 64), interval_s=30.0, scale_out_cooldown_s=60.0,
                                   scale_in_cooldown_s=300.0, scale_in_patience=5)
    planned, timeline = simulate_planner(profile, config, planner_config, day)
    result = {"peak_rate": args.peak, "num_requests": len(day), "search_runs": len(ratio.tried), "search_s": search_s,
              "args": {k: str(v) for k, v in vars(args).items()},
              "fixed": {"num_prefill": ratio.num_prefill, "num_decode": ratio.num_decode, **asdict(fixed)},
              "planner": asdict(planned)}
    (args.out / "sim-day.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(timeline, (ratio.num_prefill, ratio.num_decode), day, args.out / "sim-day.png")
    print(f"least-cost fixed {ratio.num_prefill}P:{ratio.num_decode}D at the peak: {len(ratio.tried)} runs, {search_s:.0f} s")
    for name in ("fixed", "planner"):
        print(name, {k: round(v, 4) if isinstance(v, float) else v for k, v in result[name].items()})


if __name__ == "__main__":
    main()
