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

Each fault is verified before its heal (benchmarks.harness.fault_evidence): a fault whose
evidence does not prove it took effect fails the run (exit status 3), whatever the requests
did. `--control-misdirect` aims every fault at a decoy process and port instead: that run must
fail. The rescoring rule (chaos_report.RESCORING_RULE, with its version) is written into
report.md and results.json before the first request.

Then it waits for the stack to give back what the requests held, stops it, rescores every
completed output in fp32 against the model (benchmarks.chaos_report), and writes report.md,
results.json and latency.png into `--out-dir` (default bench-results/chaos/<UTC time>).
"""

import argparse
import contextlib
import json
import logging
import math
import os
import random
import time
from dataclasses import asdict
from types import SimpleNamespace
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import grpc  # noqa: E402

from benchmarks import chaos_faults, chaos_report  # noqa: E402
from benchmarks.chaos_faults import num_restarts  # noqa: E402
from benchmarks.chaos_load import PoissonLoad  # noqa: E402
from benchmarks.chaos_stack import (ChaosStack, chaos_config, registered_ids, supervise_in_background,  # noqa: E402
                                    wait_healthy, wait_leftovers)
from benchmarks.harness import fault_checks, fault_evidence, misdirect  # noqa: E402
from benchmarks.harness.misdirect import Decoy  # noqa: E402
from shared.pb.pdserve.v1 import gateway_pb2_grpc  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments  # noqa: E402

logger = logging.getLogger("benchmarks.chaos")
BURST_KIND = ("overload burst", "gateway")
RESTART_KINDS = ("kill", "SIGTERM")  # healed by the supervisor's restart
RECOVERY_TIMEOUT_S = 300.0
CONTROL_WAIT_S = 30.0  # a control run's wait for a restart that its misdirected kill never causes


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
    parser.add_argument("--control-misdirect", action="store_true",
                        help="a control run: every fault aimed at a decoy process and a port no service uses; "
                             "its verification must fail, and so must the run")
    return parser.parse_args(argv)


def fault_kinds(args: argparse.Namespace) -> list[tuple[str, str]]:
    kinds = list(chaos_faults.available_kinds()) + [BURST_KIND]
    if args.kinds:
        wanted = [text.strip() for text in args.kinds.split(",") if text.strip()]
        kinds = [kind for kind in kinds if any(text in kind[0] for text in wanted)]
    if not kinds:
        raise SystemExit(f"no fault kind matches --kinds {args.kinds!r}")
    return kinds


def run_fault(stack, load: PoissonLoad, kind: tuple[str, str], rng: random.Random, args,
              decoy: Decoy | None = None) -> chaos_report.FaultRecord:
    """Inject, hold, verify, heal, then wait for recovery (and, after a restart, verify that
    every instance registered again)."""
    name, role = kind
    started = time.monotonic()
    if kind == BURST_KIND:
        injected = _burst(load, args, started, decoy)
        evidence = injected.verify()
    else:
        restarts = {child.name: num_restarts(stack, child.name) for child in stack.children()}
        injected = chaos_faults.inject(stack, name, role, rng, chaos_faults.FaultSettings(args.hold_s,
                                                                                       args.memory_ratio), decoy=decoy)
        try:
            if name.startswith(RESTART_KINDS):
                _wait_restarted(stack, injected.victim, restarts[injected.victim],
                                CONTROL_WAIT_S if decoy else RECOVERY_TIMEOUT_S)
            else:
                time.sleep(args.hold_s)
            evidence = injected.verify()
        finally:
            injected.heal()
        restarted = [n for n, before in restarts.items() if num_restarts(stack, n) > before]
        if restarted and not name.startswith(RESTART_KINDS):
            injected.notes.append(f"restarted by the supervisor: {', '.join(restarted)}")
    held_s = time.monotonic() - started
    recovery_s = wait_healthy(stack, rng.randrange(10**6), RECOVERY_TIMEOUT_S)
    if name.startswith(RESTART_KINDS):
        evidence.checks.append(fault_checks.registered({c.name for c in stack.instances}, registered_ids(stack)))
    record = chaos_report.FaultRecord(name, injected.victim, started - load.started_at, held_s, recovery_s,
                                      "; ".join(injected.notes), evidence)
    logger.warning("fault %s on %s: held %.1f s, recovered %.1f s later %s; %s", name, injected.victim, held_s,
                   recovery_s, record.notes, "verified" if evidence.is_verified else "NOT VERIFIED")
    return record


def _burst(load: PoissonLoad, args, started: float, decoy: Decoy | None) -> chaos_faults.Injected:
    """The arrival rate x burst factor for `hold_s` (under `decoy`, the factor is set on nothing)."""
    aimed = SimpleNamespace(rate_factor=1.0) if decoy else load
    aimed.rate_factor = args.burst_factor
    time.sleep(args.hold_s)
    aimed.rate_factor = 1.0
    ended = time.monotonic()
    injected = chaos_faults.Injected(BURST_KIND[0], f"rate x{args.burst_factor:g}", started, checks=lambda: [
        fault_checks.burst_arrivals(load.arrival_times(), started, ended, args.rate, args.burst_factor)])
    if decoy:
        injected.notes.append("control run: the burst raised nothing")
    return injected


def _wait_restarted(stack, victim: str, before: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while num_restarts(stack, victim) <= before and time.monotonic() < deadline:
        time.sleep(0.1)


def run_chaos(stack: ChaosStack, args: argparse.Namespace, decoy: Decoy | None) -> tuple[PoissonLoad, list, list]:
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
                faults.append(run_fault(stack, load, kind, rng, args, decoy))
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
    title = report_title(args, len(faults))
    text = "\n\n".join([
        f"{title}.", chaos_report.rescoring_rule_header(),
        chaos_report.summary_table(counts, leftovers, num_scored, num_wrong),
        "Failures and losses by status and message:\n\n" + ("\n".join(
            f"- {outcome}: {n} x {code} {words}" for (outcome, code, words), n in reasons.most_common()) or "- none"),
        "Recovery per fault kind (from the heal until every instance is registered and both gateways "
        "answer a probe):\n\n" + chaos_report.recovery_table(faults),
        "Faults in order:\n\n" + chaos_report.fault_log(faults),
        "Evidence that each fault took effect (read from the victim before the heal):\n\n"
        + chaos_report.evidence_text(faults),
        f"Latency per {args.window_s:g} s window:\n\n" + chaos_report.latency_table(windows),
        *([rescoring_text(scored)] if scored else []),
    ]) + "\n"
    out = args.out_dir
    (out / "report.md").write_text(text)
    write_results(args, {
        "counts": dict(counts), "leftovers": asdict(leftovers), "num_scored": num_scored, "num_wrong": num_wrong,
        "num_faults_verified": sum(f.is_verified for f in faults), "faults": [asdict(f) for f in faults],
        "windows": windows, "flagged_outputs": flagged_outputs(results, scored)})
    chaos_report.plot_latency(windows, faults, out / "latency.png", title)
    return text


def report_title(args, num_faults: int | None) -> str:
    faults = "faults to come" if num_faults is None else f"{num_faults} faults"
    control = "; CONTROL RUN: every fault aimed at a decoy (--control-misdirect)" if args.control_misdirect else ""
    return (f"Chaos: {args.duration_min:g} min at {args.rate:g} req/s (seed {args.seed}), "
            f"{faults}, 2 prefill + 2 decode + 2 gateways, {args.dtype}{control}")


def write_results(args, fields: dict) -> None:
    """results.json: the arguments and the rescoring rule first, then `fields`."""
    (args.out_dir / "results.json").write_text(json.dumps({
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "rescoring_rule": asdict(chaos_report.RESCORING_RULE), **fields}, indent=1, default=str))


def write_header(args) -> None:
    """Before the first request: the rescoring rule the run will be counted under, on disk."""
    (args.out_dir / "report.md").write_text(f"{report_title(args, None)}.\n\n{chaos_report.rescoring_rule_header()}\n")
    write_results(args, {})


def rescoring_text(scored: chaos_report.Rescoring) -> str:
    wrong = "\n".join(f"- {line}" for line in scored.wrong_lines[:20]) or "- none"
    disagreements = "\n".join(f"- {flagged.line('fp32')}" for flagged in scored.dtype_disagreements[:20])
    return (f"Wrong outputs (a token that fp32 and {scored.serving_dtype}, scored alone and fault-free, both rate "
            f"more than {chaos_report.NEAR_TIE_NATS:g} nats below their best; rule "
            f"v{chaos_report.RESCORING_RULE.version}):\n\n{wrong}\n\n"
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
    write_header(args)
    stack = ChaosStack(chaos_config(args.dtype, args.out_dir / "stack", args.gateway_args.split(), []))
    stack.start()
    stop_supervising = supervise_in_background(stack)
    try:
        with misdirect.decoy() if args.control_misdirect else contextlib.nullcontext() as decoy:
            if math.isnan(wait_healthy(stack, args.seed, RECOVERY_TIMEOUT_S)):
                raise SystemExit("the stack never became healthy; logs in " + str(stack.run_dir / "logs"))
            load, results, faults = run_chaos(stack, args, decoy)
        leftovers = wait_leftovers(stack)
    finally:
        stop_supervising.set()
        stack.stop()
    text = write_report(args, load, results, faults, leftovers, None)  # on disk before the (long) rescoring
    if not args.control_misdirect:  # a control run proves the verification fails; its outputs are not scored
        text = write_report(args, load, results, faults, leftovers,
                            chaos_report.rescore(results, stack.config.model, args.dtype))
    print(text)
    print(f"report, results.json and latency.png in {args.out_dir}; stack logs in {stack.run_dir / 'logs'}")
    raise SystemExit(verification_status(faults))


def verification_status(faults: list[chaos_report.FaultRecord]) -> int:
    """The run's exit status: a fault not verified (or never injected) fails the run."""
    evidence = chaos_report.all_evidence(faults)
    print(fault_evidence.summary(evidence))
    return fault_evidence.exit_status(evidence)


if __name__ == "__main__":
    main()
