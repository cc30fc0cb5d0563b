"""`pdserve simulate`: a discrete-event simulation of a P/D cluster driven by a profile from
`pdserve profile`. Finds the least-cost fixed P:D for a trace and compares the planner on it
(SLO attainment, instance-hours, scale events), or runs one fixed P:D."""

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Called by services.cli.main.build_parser to register this subcommand."""
    from services.planner.flags import add_policy_arguments

    parser = subparsers.add_parser("simulate", help="simulate a P/D cluster at any scale from a profile",
                                   description=__doc__)
    parser.add_argument("--profile", type=Path, required=True, help="profile JSON from `pdserve profile`")
    parser.add_argument("--trace", choices=("poisson", "bursty", "diurnal"), default="poisson")
    parser.add_argument("--rate", type=float, default=10.0, help="req/s (diurnal: the day's peak)")
    parser.add_argument("--duration", type=float, default=300.0, help="simulated seconds")
    parser.add_argument("--day-length", type=float, default=86_400.0, help="seconds in one diurnal cycle")
    parser.add_argument("--prompt-median", type=int, default=256)
    parser.add_argument("--output-median", type=int, default=128)
    parser.add_argument("--prefix-share", type=float, default=0.5, help="requests opening with a common prefix")
    parser.add_argument("--startup", type=float, default=30.0, help="seconds a new instance takes to serve")
    parser.add_argument("--kv-bandwidth-gbs", type=float, default=1.0,
                        help="KV transfer GB/s, when the profile has no transfer points")
    parser.add_argument("--shared-host", action="store_true",
                        help="all instances share one host of the profile's cores (and its co-location "
                             "slowdown), like `pdserve up` on one machine; default: a machine each")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.9, help="SLO attainment a fixed P:D must reach")
    parser.add_argument("--fixed", default=None, metavar="P:D", help="only simulate this fixed P:D")
    parser.add_argument("--max-per-pool", type=int, default=1024, help="ratio search bound per pool")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    add_policy_arguments(parser)
    parser.set_defaults(run=run)


def _setup(args: argparse.Namespace):
    from services.cost_model.perf_profile import PerfProfile
    from services.simulator.cluster import SimConfig
    from services.simulator.workload import LengthModel, make_trace

    lengths = LengthModel(prompt_median=args.prompt_median, output_median=args.output_median,
                          prefix_share=args.prefix_share)
    profile = PerfProfile.load(args.profile)
    shared = {"host_cores": profile.host_cores or 1, "colocated_slowdown": profile.colocated_slowdown} \
        if args.shared_host else {}
    policy = planner_policy(args)
    config = SimConfig(ttft_slo_s=policy.ttft_slo_s, itl_slo_s=policy.itl_slo_s, startup_s=args.startup,
                       kv_bandwidth_bytes_s=args.kv_bandwidth_gbs * 1e9, interval_s=policy.interval_s, **shared)
    requests = make_trace(args.trace, args.rate, args.duration, lengths, args.seed, day_s=args.day_length)
    return profile, config, requests


def _line(label: str, summary) -> str:
    return (f"{label:<26} SLO {summary.slo_attainment:6.1%}  TTFT p90 {summary.ttft_p90_s:7.2f} s  "
            f"TPOT p90 {summary.tpot_p90_s * 1e3:6.0f} ms  instance-h {summary.instance_hours:8.2f}  "
            f"scale events {summary.scale_events}")


def planner_policy(args: argparse.Namespace):
    """The planner's SLOs and interval, resolved like its other settings (flag > env > file >
    default): the planner flags are settings, not plain argparse values."""
    from services.planner.flags import config_from_args
    return config_from_args(args)


def run(args: argparse.Namespace) -> int:
    from services.planner.flags import config_from_args
    from services.simulator.search import least_cost_ratio, simulate_fixed, simulate_planner

    profile, config, requests = _setup(args)
    print(f"{len(requests)} requests, {args.trace} at {args.rate} req/s over {args.duration:.0f} s")
    results = {}
    if args.fixed:
        num_prefill, num_decode = (int(part) for part in args.fixed.split(":"))
        results["fixed"] = asdict(simulate_fixed(profile, config, requests, num_prefill, num_decode))
        print(_line(f"fixed {num_prefill}P:{num_decode}D", simulate_fixed(profile, config, requests,
                                                                         num_prefill, num_decode)))
    else:
        started = time.perf_counter()
        ratio = least_cost_ratio(profile, config, requests, args.target, args.max_per_pool)
        search_s = time.perf_counter() - started
        planned, timeline = simulate_planner(profile, config, config_from_args(args), requests)
        searched = f"{len(ratio.tried)} runs in {search_s:.0f} s"
        met = "" if ratio.met else f" (misses {args.target:.0%} even at {args.max_per_pool} per pool)"
        label = f"least-cost fixed {ratio.num_prefill}P:{ratio.num_decode}D"
        print(_line(label, ratio.summary) + f"  [{searched}]{met}")
        print(_line("planner", planned))
        results = {"least_cost_fixed": {"num_prefill": ratio.num_prefill, "num_decode": ratio.num_decode,
                                        "met": ratio.met, "search_s": search_s,
                                        **asdict(ratio.summary)},
                   "planner": asdict(planned), "planner_timeline": timeline, "search_runs": ratio.tried}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0
