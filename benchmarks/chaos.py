"""Chaos benchmark (`make bench-chaos`): the local stack under steady load while faults come and go.

Starts Redis, 2 prefill + 2 decode instances and two gateways (benchmarks.chaos_stack, all
supervised), sends greedy streaming requests as a Poisson process over both gateways
(benchmarks.chaos_load) for `--duration-min` minutes (CHAOS_MINUTES), and every `--interval-s`
(drawn between the two values, seeded) injects one fault drawn from the kinds below, holds it,
heals it and measures the recovery (until every instance is registered and both gateways answer).
Kinds (benchmarks.chaos_faults): kill -9 / SIGTERM of a prefill or decode instance, kill -9 of
Redis, SIGSTOP of an instance's or Redis's process tree, a memory cgroup limit at an instance's
working set, its engine core restarted inside it (root only), and an overload burst (the arrival rate times
`--burst-factor`, which the gateways must shed with RESOURCE_EXHAUSTED and Retry-After).
The same seed gives the same faults at the same times against the same victims.

Then it waits for the stack to give back what the requests held, stops it, rescores every
completed output in fp32 against the model (benchmarks.chaos_report), and writes report.md,
results.json and latency.png into `--out-dir` (default bench-results/chaos/<UTC time>).
"""

import argparse
import json
import logging
import math
import os
import random
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import grpc  # noqa: E402

from benchmarks import chaos_faults, chaos_report  # noqa: E402
from benchmarks.chaos_load import PoissonLoad  # noqa: E402
from benchmarks.chaos_stack import ChaosStack, chaos_config, supervise_in_background, wait_healthy, wait_leftovers  # noqa: E402,E501
from shared.pb.pdserve.v1 import gateway_pb2_grpc  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments  # noqa: E402

logger = logging.getLogger("benchmarks.chaos")
BURST_KIND = ("overload burst", "gateway")
RECOVERY_TIMEOUT_S = 300.0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-min", type=float, default=float(os.environ.get("CHAOS_MINUTES", 5)))
    parser.add_argument("--interval-s", type=float, nargs=2, default=(30.0, 90.0), metavar=("MIN", "MAX"),
                        help="seconds from one fault's recovery to the next fault, drawn uniformly")
    parser.add_argument("--hold-s", type=float, default=20.0, help="how long a SIGSTOP, limit or burst lasts")
    parser.add_argument("--rate", type=float, default=0.5, help="requests per second (Poisson)")
    parser.add_argument("--burst-factor", type=float, default=8.0, help="the rate multiplier of an overload burst")
    parser.add_argument("--memory-ratio", type=float, default=1.0,
                        help="a memory limit as a share of the victim engine core's working set (anonymous memory)")
    parser.add_argument("--kinds", default="", help="comma-separated substrings: only fault kinds containing one")
    parser.add_argument("--timeout-s", type=float, default=180.0, help="each request's client deadline")
    parser.add_argument("--seed", type=int, default=0)
    add_engine_arguments(parser, "dtype")
    parser.add_argument("--gateway-args", default="", help="extra flags for both gateways")
    parser.add_argument("--window-s", type=float, default=30.0, help="latency percentile window")
    parser.add_argument("--out-dir", type=Path, default=None)
    return parser.parse_args(argv)


def fault_kinds(args: argparse.Namespace) -> list[tuple[str, str]]:
    kinds = list(chaos_faults.available_kinds()) + [BURST_KIND]
    if args.kinds:
        wanted = [text.strip() for text in args.kinds.split(",") if text.strip()]
        kinds = [kind for kind in kinds if any(text in kind[0] for text in wanted)]
    if not kinds:
        raise SystemExit(f"no fault kind matches --kinds {args.kinds!r}")
    return kinds


def num_restarts(stack, name: str) -> int:
    return next((r.num_restarts for r in stack.supervisor.records() if r.name == name), 0)


def run_fault(stack, load: PoissonLoad, kind: tuple[str, str], rng: random.Random, args) -> chaos_report.FaultRecord:
    """Inject, hold, heal, then wait for recovery."""
    name, role = kind
    started = time.monotonic()
    if kind == BURST_KIND:
        load.rate_factor = args.burst_factor
        time.sleep(args.hold_s)
        load.rate_factor = 1.0
        injected = chaos_faults.Injected(name, f"rate x{args.burst_factor:g}", started)
    else:
        restarts = {child.name: num_restarts(stack, child.name) for child in stack.children()}
        injected = chaos_faults.inject(stack, name, role, rng, chaos_faults.FaultSettings(args.hold_s,
                                                                                       args.memory_ratio))
        try:
            if name.startswith(("kill", "SIGTERM")):
                _wait_restarted(stack, injected.victim, restarts[injected.victim])
            else:
                time.sleep(args.hold_s)
        finally:
            injected.heal()
        restarted = [n for n, before in restarts.items() if num_restarts(stack, n) > before]
        if restarted and not name.startswith(("kill", "SIGTERM")):
            injected.notes.append(f"restarted by the supervisor: {', '.join(restarted)}")
    held_s = time.monotonic() - started
    recovery_s = wait_healthy(stack, rng.randrange(10**6), RECOVERY_TIMEOUT_S)
    record = chaos_report.FaultRecord(name, injected.victim, started - load.started_at, held_s, recovery_s,
                                      "; ".join(injected.notes))
    logger.warning("fault %s on %s: held %.1f s, recovered %.1f s later %s", name, injected.victim, held_s,
                   recovery_s, record.notes)
    return record


def _wait_restarted(stack, victim: str, before: int) -> None:
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while num_restarts(stack, victim) <= before and time.monotonic() < deadline:
        time.sleep(0.1)


def run_chaos(stack: ChaosStack, args: argparse.Namespace) -> tuple[PoissonLoad, list, list]:
    kinds, rng = fault_kinds(args), random.Random(args.seed)
    channels = [grpc.insecure_channel(address) for address in stack.gateway_addresses]
    load = PoissonLoad([gateway_pb2_grpc.GatewayStub(c) for c in channels], args.rate, args.seed,
                       timeout_s=args.timeout_s)
    faults = []
    load.start()
    end_at = load.started_at + args.duration_min * 60
    try:
        while True:
            next_at = time.monotonic() + rng.uniform(*args.interval_s)
            if next_at + args.hold_s >= end_at:
                break
            time.sleep(max(0.0, next_at - time.monotonic()))
            kind = rng.choice(kinds)
            try:
                faults.append(run_fault(stack, load, kind, rng, args))
            except Exception as error:  # noqa: BLE001 - one fault that cannot be injected ends nothing
                logger.exception("fault %s could not be injected", kind[0])
                faults.append(chaos_report.FaultRecord(kind[0], "-", time.monotonic() - load.started_at, 0.0,
                                                       float("nan"), f"not injected: {error!r}"))
        time.sleep(max(0.0, end_at - time.monotonic()))
    finally:
        load.stop_arrivals()
        results = load.results()
        for channel in channels:
            channel.close()
    return load, results, faults


def write_report(args, load: PoissonLoad, results, faults, leftovers, scored: chaos_report.Rescoring | None) -> str:
    """report.md, results.json and latency.png; `scored`: the rescoring, None before it."""
    counts = chaos_report.outcomes(results, args.timeout_s)
    num_scored, num_wrong = (scored.num_scored, len(scored.wrong)) if scored else ("not yet", "-")
    windows = chaos_report.latency_windows(results, load.started_at, args.window_s)
    reasons = chaos_report.failure_reasons(results, args.timeout_s)
    title = (f"Chaos: {args.duration_min:g} min at {args.rate:g} req/s (seed {args.seed}), "
             f"{len(faults)} faults, 2 prefill + 2 decode + 2 gateways, {args.dtype}")
    text = "\n\n".join([
        f"{title}.", chaos_report.summary_table(counts, leftovers, num_scored, num_wrong),
        "Failures and losses by status and message:\n\n" + ("\n".join(
            f"- {outcome}: {n} x {code} {words}" for (outcome, code, words), n in reasons.most_common()) or "- none"),
        "Recovery per fault kind (from the heal until every instance is registered and both gateways "
        "answer a probe):\n\n" + chaos_report.recovery_table(faults),
        "Faults in order:\n\n" + chaos_report.fault_log(faults),
        f"Latency per {args.window_s:g} s window:\n\n" + chaos_report.latency_table(windows),
        *([rescoring_text(scored)] if scored else []),
    ]) + "\n"
    out = args.out_dir
    (out / "report.md").write_text(text)
    (out / "results.json").write_text(json.dumps({
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "counts": dict(counts), "leftovers": asdict(leftovers), "num_scored": num_scored, "num_wrong": num_wrong,
        "faults": [asdict(f) for f in faults], "windows": windows,
        "flagged_outputs": flagged_outputs(results, scored)}, indent=1, default=str))
    chaos_report.plot_latency(windows, faults, out / "latency.png", title)
    return text


def rescoring_text(scored: chaos_report.Rescoring) -> str:
    wrong = "\n".join(f"- {line}" for line in scored.wrong_lines[:20]) or "- none"
    disagreements = "\n".join(f"- {flagged.line('fp32')}" for flagged in scored.dtype_disagreements[:20])
    return (f"Wrong outputs (a token that fp32 and {scored.serving_dtype}, scored alone and fault-free, both rate "
            f"more than {chaos_report.NEAR_TIE_NATS:g} nats below their best):\n\n{wrong}\n\n"
            f"Tokens where fp32 prefers another by more than {chaos_report.NEAR_TIE_NATS:g} nats but "
            f"{scored.serving_dtype} chooses them too (dtype disagreements, not errors): "
            f"{len(scored.dtype_disagreements)}" + (f"\n\n{disagreements}" if disagreements else ""))


def flagged_outputs(results, scored: chaos_report.Rescoring | None) -> list[dict]:
    """Prompt and output ids of every flagged request, to replay it."""
    if not scored:
        return []
    indices = {f.request for f in scored.wrong + scored.dtype_disagreements}
    return [{"index": r.index, "prompt_ids": r.prompt_ids, "token_ids": r.token_ids}
            for r in results if r.index in indices]


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from benchmarks.machine import default_model_paths, print_machine

    print_machine(default_model_paths(args.dtype))
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    args.out_dir = args.out_dir or Path("bench-results/chaos") / stamp
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stack = ChaosStack(chaos_config(args.dtype, args.out_dir / "stack", args.gateway_args.split(), []))
    stack.start()
    stop_supervising = supervise_in_background(stack)
    try:
        if math.isnan(wait_healthy(stack, args.seed, RECOVERY_TIMEOUT_S)):
            raise SystemExit("the stack never became healthy; logs in " + str(stack.run_dir / "logs"))
        load, results, faults = run_chaos(stack, args)
        leftovers = wait_leftovers(stack)
    finally:
        stop_supervising.set()
        stack.stop()
    write_report(args, load, results, faults, leftovers, None)  # on disk before the (long) rescoring
    scored = chaos_report.rescore(results, stack.config.model, args.dtype)
    print(write_report(args, load, results, faults, leftovers, scored))
    print(f"report, results.json and latency.png in {args.out_dir}; stack logs in {stack.run_dir / 'logs'}")


if __name__ == "__main__":
    main()
