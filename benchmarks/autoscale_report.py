"""Figures and plots of `make bench-autoscale` from the runs' JSON files, and the simulator's
replay of the same trace (the small-scale validation of `pdserve simulate`)."""

import json
from pathlib import Path

import numpy as np

from services.cost_model.perf_profile import PerfProfile
from services.simulator.cluster import SimConfig
from services.simulator.search import simulate_fixed, simulate_planner
from services.simulator.workload import SimRequest

MODES = ("autoscale", "fixed")


def request_latencies(record: dict) -> tuple[float, float, float] | None:
    """(start s, TTFT s, TPOT s) of a successful request."""
    if record["error"] or not record["chunk_times_s"]:
        return None
    times, tokens = record["chunk_times_s"], sum(record["chunk_num_tokens"])
    tpot = (times[-1] - times[0]) / (tokens - 1) if tokens > 1 else 0.0
    return record["start_s"], times[0], tpot


def mode_figures(result: dict, ttft_slo: float, itl_slo: float) -> dict:
    rows = [r for r in map(request_latencies, result["records"]) if r is not None]
    ttft, tpot = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
    pools = np.array(result["pools"]) if result["pools"] else np.zeros((1, 3))
    instance_s = float(np.sum(pools[:, 1] + pools[:, 2]))  # one sample a second
    changes = sum(1 for d in result["decisions"] for role in ("prefill", "decode") if d[role]["action"] != "hold")
    return {"requests": len(result["records"]), "failed": len(result["records"]) - len(rows),
            "slo_attainment": float(np.mean((ttft <= ttft_slo) & (tpot <= itl_slo))),
            "ttft_p50_s": float(np.quantile(ttft, 0.5)), "ttft_p90_s": float(np.quantile(ttft, 0.9)),
            "tpot_p50_s": float(np.quantile(tpot, 0.5)), "tpot_p90_s": float(np.quantile(tpot, 0.9)),
            "instance_seconds": instance_s, "scale_events": changes,
            "max_prefill": int(pools[:, 1].max()), "max_decode": int(pools[:, 2].max())}


def local_host(profile: PerfProfile) -> dict:
    """The local stack's instances share this host: the simulator's shared-host model."""
    return {"host_cores": profile.host_cores or 2, "colocated_slowdown": profile.colocated_slowdown}


def replay(result: dict) -> list[SimRequest]:
    return [SimRequest(r["index"], r["start_s"], r["prompt_len"], r["expected_output_len"], None, 0)
            for r in result["records"]]


def simulated_figures(result: dict, profile: PerfProfile, ttft_slo: float, itl_slo: float) -> dict:
    from benchmarks.autoscale import planner_config  # the same policy as the measured run
    from argparse import Namespace

    config = SimConfig(ttft_slo_s=ttft_slo, itl_slo_s=itl_slo, startup_s=20.0, interval_s=5.0, **local_host(profile))
    requests = replay(result)
    if result["mode"] == "fixed":
        summary = simulate_fixed(profile, config, requests, 1, 1)
    else:
        args = Namespace(**{k: float(v) if k in ("ttft_slo", "itl_slo") else v for k, v in result["args"].items()})
        args.max_prefill, args.max_decode = int(args.max_prefill), int(args.max_decode)
        summary, _ = simulate_planner(profile, config, planner_config(args), requests)
    return {"slo_attainment": summary.slo_attainment, "ttft_p50_s": summary.ttft_p50_s,
            "ttft_p90_s": summary.ttft_p90_s, "tpot_p50_s": summary.tpot_p50_s, "tpot_p90_s": summary.tpot_p90_s,
            "instance_seconds": summary.instance_hours * 3600, "scale_events": summary.scale_events}


def phase_comparison(result: dict, profile: PerfProfile, ttft_slo: float, itl_slo: float) -> list[dict]:
    """Measured vs simulated TTFT/TPOT p50 and p90 of fixed 1P+1D, by thirds of the ramp
    (arrival rate rising, high, falling): the simulator's validation at small scale."""
    from services.simulator.cluster import ClusterSim
    from services.simulator.scalers import FixedScaler

    config = SimConfig(ttft_slo_s=ttft_slo, itl_slo_s=itl_slo, interval_s=5.0, **local_host(profile))
    recorder = ClusterSim(profile, config, FixedScaler(1, 1), 1, 1).run(replay(result))
    measured = {r["index"]: request_latencies(r) for r in result["records"]}
    end = max(r["start_s"] for r in result["records"])
    rows = []
    for phase in range(3):
        ids = [i for i, m in measured.items() if m is not None and phase * end / 3 <= m[0] < (phase + 1) * end / 3 + 1e-9]
        row = {"phase": phase, "requests": len(ids), "rate": len(ids) / (end / 3)}
        for name, real, sim in (("ttft", [measured[i][1] for i in ids], [recorder.ttft[i] for i in ids]),
                                ("tpot", [measured[i][2] for i in ids], [recorder.tpot[i] for i in ids])):
            for q in (0.5, 0.9):
                row[f"{name}_p{int(q * 100)}_measured"] = float(np.quantile(real, q))
                row[f"{name}_p{int(q * 100)}_simulated"] = float(np.quantile(sim, q))
        rows.append(row)
    return rows


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    for mode, result in results.items():
        pools = np.array(result["pools"])
        rows = np.array([r for r in map(request_latencies, result["records"]) if r is not None])
        if len(pools):
            axes[0].step(pools[:, 0], pools[:, 1], where="post", label=f"{mode}: prefill")
            axes[0].step(pools[:, 0], pools[:, 2], where="post", linestyle="--", label=f"{mode}: decode")
        starts = np.array([r["start_s"] for r in result["records"]])
        bins = np.arange(0, starts.max() + 10, 10)
        axes[1].plot(bins[:-1] + 5, np.histogram(starts, bins)[0] / 10, label=mode)
        axes[2].scatter(rows[:, 0], rows[:, 1], s=6, label=mode)
        axes[3].scatter(rows[:, 0], rows[:, 2] * 1e3, s=6, label=mode)
    for axis, label in zip(axes, ("instances alive", "requests/s (10 s bins)", "TTFT s", "TPOT ms")):
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    axes[2].set_yscale("log")
    axes[3].set_xlabel("seconds since the ramp started")
    figure.suptitle("make bench-autoscale: load ramp, --autoscale vs fixed 1P+1D")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_report(out: Path, profile_path: Path, ttft_slo: float, itl_slo: float) -> None:
    results = {m: json.loads((out / f"{m}.json").read_text()) for m in MODES if (out / f"{m}.json").exists()}
    if not results:
        return
    profile = PerfProfile.load(profile_path)
    table = {}
    for mode, result in results.items():
        table[mode] = {"measured": mode_figures(result, ttft_slo, itl_slo),
                       "simulated": simulated_figures(result, profile, ttft_slo, itl_slo)}
    if "fixed" in results:
        table["fixed"]["phases"] = phase_comparison(results["fixed"], profile, ttft_slo, itl_slo)
    (out / "report.json").write_text(json.dumps(table, indent=1) + "\n")
    plot(results, out / "autoscale.png")
    for mode, figures in table.items():
        for kind, values in figures.items():
            if kind == "phases":
                for row in values:
                    print(f"{mode:<10} phase {row['phase']}  " + "  ".join(
                        f"{k} {v:.3g}" for k, v in row.items() if k != "phase"))
                continue
            print(f"{mode:<10} {kind:<10} " + "  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                                       for k, v in values.items()))
