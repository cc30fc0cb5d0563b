"""The simulator against the real local stack: replays the requests of `benchmarks.sim_validate`
(same arrival times and lengths) through the simulator with the profile, and compares TTFT
and ITL percentiles per rate. Two simulator models are shown: the new one (the profile's KV
transfer time, the shared-host CPU model: both instances on this host's cores, slowed by the
profile's co-location factor) and the old one (separate machines, 1 GB/s transfer).

    python -m benchmarks.sim_validate_report --runs bench-results/sim-validate/runs.json \
        --profile docs/autoscaling/profile-smollm2-cpu-fp32.json --out docs/autoscaling
"""

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from services.cost_model.perf_profile import PerfProfile
from services.simulator.cluster import ClusterSim, SimConfig
from services.simulator.recorder import weighted_quantiles
from services.simulator.scalers import FixedScaler
from services.simulator.workload import SimRequest

QUANTILES = (0.5, 0.9, 0.99)
TOLERANCE = 0.25


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("bench-results/sim-validate/runs.json"))
    parser.add_argument("--profile", type=Path, default=Path("docs/autoscaling/profile-smollm2-cpu-fp32.json"))
    parser.add_argument("--out", type=Path, default=Path("docs/autoscaling"))
    return parser.parse_args()


def measured_latencies(records: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(TTFT per request, ITL per token, weight per ITL sample) of the successful requests."""
    ttfts, gaps, weights = [], [], []
    for record in records:
        if record["error"] or not record["chunk_times_s"]:
            continue
        times, counts = record["chunk_times_s"], record["chunk_num_tokens"]
        ttfts.append(times[0])
        for previous, now, count in zip(times, times[1:], counts[1:]):
            gaps.append((now - previous) / count)
            weights.append(count)
    return np.array(ttfts), np.array(gaps), np.array(weights, dtype=float)


def replay(records: list[dict]) -> list[SimRequest]:
    ordered = sorted(records, key=lambda r: r["start_s"])
    return [SimRequest(i, r["start_s"], r["prompt_len"], r["expected_output_len"], None, 0)
            for i, r in enumerate(ordered)]


def simulated_latencies(profile: PerfProfile, config: SimConfig, records: list[dict]):
    recorder = ClusterSim(profile, config, FixedScaler(1, 1), 1, 1).run(replay(records))
    durations, batches = recorder.itl_samples
    return np.array(list(recorder.ttft.values())), durations, batches.astype(float)


def percentiles(ttft, itl, itl_weights) -> dict[str, float]:
    row = {f"ttft_p{int(q * 100)}": float(np.quantile(ttft, q)) for q in QUANTILES}
    row.update({f"itl_p{int(q * 100)}": v for q, v in zip(QUANTILES, weighted_quantiles(itl, itl_weights, QUANTILES))})
    return row


def models(profile: PerfProfile, host_cores: int) -> dict[str, tuple[PerfProfile, SimConfig]]:
    base = SimConfig(interval_s=5.0)
    shared = replace(base, host_cores=host_cores, colocated_slowdown=profile.colocated_slowdown)
    old = replace(profile, transfer=[], transfer_fit=[])
    return {"simulated": (profile, shared), "old model": (old, base)}


def compare(runs: dict, profile: PerfProfile) -> list[dict]:
    rows = []
    for run in runs["runs"]:
        measured = percentiles(*measured_latencies(run["records"]))
        row = {"rate": run["rate"], "requests": len(run["records"]), "cores_used": run["cores_used"],
               "load_average": run["load_average"], "measured": measured}
        for name, (model_profile, config) in models(profile, runs["host_cores"]).items():
            simulated = percentiles(*simulated_latencies(model_profile, config, run["records"]))
            row[name] = simulated
            row[f"{name} error"] = {k: simulated[k] / measured[k] - 1 for k in measured}
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    keys = list(rows[0]["measured"])
    lines = ["| rate req/s (requests) | " + " | ".join(k.replace("_", " ") for k in keys) + " |",
             "| --- |" + " --- |" * len(keys)]
    for row in rows:
        cells = []
        for key in keys:
            measured, simulated, error = row["measured"][key], row["simulated"][key], row["simulated error"][key]
            scale, unit = (1.0, "s") if key.startswith("ttft") else (1e3, "ms")
            mark = "" if abs(error) <= TOLERANCE else " **x**"
            cells.append(f"{measured * scale:.3g} / {simulated * scale:.3g} {unit} ({error:+.0%}){mark}")
        lines.append(f"| {row['rate']:g} ({row['requests']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(rows[0]["measured"])
    figure, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 4), squeeze=False)
    for axis, row in zip(axes[0], rows):
        x = np.arange(len(keys))
        for offset, name in ((-0.27, "measured"), (0.0, "simulated"), (0.27, "old model")):
            values = [row[name][k] * (1.0 if k.startswith("ttft") else 1e3) for k in keys]
            axis.bar(x + offset, values, width=0.27, label=name)
        axis.set_xticks(x, [k.replace("_", "\n") for k in keys], fontsize=8)
        axis.set_yscale("log")
        axis.set_title(f"{row['rate']:g} req/s (TTFT s, ITL ms)")
        axis.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=8)
    figure.suptitle("Simulator vs the local stack (1 prefill + 1 decode on this host)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def request_overhead_s(profile: PerfProfile, lone: list[dict]) -> float:
    """Median of the lone requests' TTFT beyond the profile's prefill and KV transfer (>= 0)."""
    if not lone:
        return profile.request_overhead_s
    extra = [record["chunk_times_s"][0] - profile.prefill_s(record["prompt_len"])
             - (profile.kv_transfer_s(record["prompt_len"]) or 0.0) for record in lone]
    return max(0.0, float(np.median(extra)))


def main() -> None:
    args = parse_args()
    runs = json.loads(args.runs.read_text())
    profile = PerfProfile.load(args.profile)
    overhead = request_overhead_s(profile, runs.get("lone", []))
    profile = replace(profile, request_overhead_s=overhead)
    print(f"request path overhead from {len(runs.get('lone', []))} lone requests: {overhead * 1e3:.0f} ms")
    args.out.mkdir(parents=True, exist_ok=True)
    profile.save(args.out / "profile-with-overhead.json")  # what the planner and `pdserve simulate` should use
    rows = compare(runs, profile)
    (args.out / "sim-validation.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, args.out / "sim-validation.png")
    print(markdown(rows))
    worst = max(abs(e) for row in rows for e in row["simulated error"].values())
    print(f"worst error {worst:.0%} (target {TOLERANCE:.0%})")


if __name__ == "__main__":
    main()
