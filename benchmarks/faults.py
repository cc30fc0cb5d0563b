"""Faults under load (`make bench-faults`): components killed or stopped while streams run.

Starts a supervised stack (Redis, 2 prefill + 2 decode instances, a gateway; a child that exits
unasked is restarted, as under `pdserve up`), then per scenario runs greedy streaming requests
(random prompts of 100-300 tokens, 64 output tokens, EOS ignored) and injects the fault once
some streams are running. Prints one row per scenario: requests ok / failed, streams migrated
(the gateway's `pdserve:migrations_total`), recovery time (fault until the victim is back,
SERVING and registered, or for Redis until every instance is registered again; for a SIGSTOP
scenario, whose victim's process tree stays stopped for 20 s and is then continued, from the
stop until every instance is registered again), and p99 TTFT
of the requests that started in the fault window and p99 inter-token latency inside it, and
blocks stranded: blocks still held on live instances once the load is over (target 0).

"holder kill -9 mid-pull" (benchmarks.fault_pull) runs on a stack of its own, with the host
tier off so that peers are the only source of a prefix, under two-turn chats whose second turns
pull the first turn's KV from the decode instance that generated it; it kills that holder while
a pull waits on it and adds the pulls that happened and whether the pulled prompt came out
right. The two churn scenarios (benchmarks.harness.peer_churn, docs/chaos.md) kill -9 prefill-1,
then decode-1, --churn-cycles times under --churn-streams streams each, every restart on the
same gRPC and UCX address (their ports are fixed), and report what the survivors kept: lingering
transport operations, cached connections, RSS growth. The abort storm cancels --storm-aborts
client calls mid-transfer (benchmarks.harness.abort_storm) while streams run, and checks the
completed outputs (fp32), what is left held, and the late writes refused. `--scenario TEXT`
(repeatable) runs only the scenarios whose name contains TEXT.

Every fault is verified (benchmarks.harness.fault_evidence, shared with bench-chaos): a SIGSTOP
by state T for every process of the victim's tree before SIGCONT, a kill or SIGTERM by the
victim's new pid (the old one gone), its restart count and every instance registered again.
The evidence is printed under each row; a fault not verified fails the run (exit status 3).
`--control-misdirect` aims every fault at a decoy process instead: that run must fail.
"""

import argparse
import contextlib
import logging
import os
import random
import re
import signal
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import grpc  # noqa: E402

from benchmarks import chaos_faults, fault_pull  # noqa: E402
from benchmarks.chaos_faults import num_restarts  # noqa: E402
from benchmarks.chaos_stack import registered_ids  # noqa: E402
from benchmarks.fault_chat_load import ChatLoad  # noqa: E402
from benchmarks.fault_load import StreamingLoad, StreamResult, failures  # noqa: E402
from benchmarks.harness import abort_storm, fault_checks, fault_evidence, misdirect, peer_churn  # noqa: E402
from benchmarks.harness.fault_evidence import Check, FaultEvidence  # noqa: E402
from benchmarks.harness.misdirect import Decoy  # noqa: E402
from services.launcher import LocalStack, StackConfig  # noqa: E402
from services.launcher.config import InstancePorts  # noqa: E402
from services.launcher.ports import find_free_port  # noqa: E402
from services.launcher.supervisor import RestartPolicy  # noqa: E402
from shared.model.default_model import resolve_model  # noqa: E402
from shared.pb.pdserve.v1 import gateway_pb2_grpc, instance_pb2, instance_pb2_grpc  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments  # noqa: E402

logger = logging.getLogger("benchmarks.faults")

# (scenario, victim, signal); the first row is the same load without a fault.
SCENARIOS = (
    ("none (baseline)", None, None),
    ("redis kill -9", "redis", signal.SIGKILL),
    ("prefill kill -9", "prefill-0", signal.SIGKILL),
    ("decode kill -9 (migration)", "decode-0", signal.SIGKILL),
    ("decode SIGTERM (drain)", "decode-1", signal.SIGTERM),
    ("prefill SIGTERM (drain)", "prefill-1", signal.SIGTERM),
    # Hung, not dead: the victim's process tree is stopped for HUNG_S, then continued.
    ("decode SIGSTOP 20s", "decode-0", signal.SIGSTOP),
    ("prefill SIGSTOP 20s", "prefill-0", signal.SIGSTOP),
    ("redis SIGSTOP 20s", "redis", signal.SIGSTOP),
)
HUNG_S = 20.0  # how long a SIGSTOP scenario's victim stays stopped
# The fault kind (benchmarks.chaos_faults) that injects and verifies each scenario's signal.
SIGNAL_KINDS = {signal.SIGKILL: "kill -9", signal.SIGTERM: "SIGTERM", signal.SIGSTOP: "SIGSTOP"}
CONTROL_WAIT_S = 30.0  # a control run's wait for a restart that its misdirected kill never causes
# Runs on its own stack (host tier off, chats); the victim is the holder the pulls used.
PULL_SCENARIO = "holder kill -9 mid-pull"
# Peer churn (benchmarks.harness.peer_churn): the victim killed and restarted on the same gRPC and
# UCX address --churn-cycles times, each under --churn-streams streams; its ports are fixed.
# Clients cancelling mid-transfer (benchmarks.harness.abort_storm) while --num-requests streams run.
STORM_SCENARIO = "abort storm: client cancels mid-transfer"
STORM_PROMPT_TOKENS = 200
CHURN_SCENARIOS = {"prefill churn: kill -9 + restart on the same address": "prefill-1",
                   "decode churn: kill -9 + restart on the same address": "decode-1"}


@dataclass
class Row:
    scenario: str
    num_ok: int
    num_failed: int
    num_migrated: int
    recovery_s: float
    ttft_p99_ms: float
    itl_p99_ms: float
    num_stranded: int = 0
    num_pulls: int | None = None  # peer pulls served during the scenario (the pull scenario only)
    pulled_right: str = "-"  # the pull scenario: did the pull the kill hit end computed, and right
    note: str = ""
    evidence: FaultEvidence | None = None  # what proved the fault took effect (None: the baseline)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=24, help="requests per scenario")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=64)
    add_engine_arguments(parser, "dtype")
    parser.add_argument("--scenario", action="append", help="run only scenarios containing this text")
    parser.add_argument("--storm-aborts", type=int, default=1000, help="client aborts in the abort storm")
    parser.add_argument("--storm-concurrency", type=int, default=8, help="aborting clients at once")
    parser.add_argument("--churn-cycles", type=int, default=10, help="restarts per churn scenario")
    parser.add_argument("--churn-streams", type=int, default=40, help="streams running at each churn restart")
    parser.add_argument("--control-misdirect", action="store_true",
                        help="a control run: every fault aimed at a decoy process no service uses; its "
                             "verification must fail, and so must the run")
    return parser.parse_args()


def start_stack(dtype: str, instance_args: tuple[str, ...] = (), gateway_args: tuple[str, ...] = ()) -> LocalStack:
    extra_args = {"instance": ["--heartbeat-interval-s", "0.5", "--heartbeat-ttl-s", "2", *instance_args]}
    if gateway_args:
        extra_args["gateway"] = list(gateway_args)
    config = StackConfig(num_prefill=2, num_decode=2, model=str(resolve_model(None)), dtype=dtype, num_threads=1,
                         gateway_port=0, gateway_http_port=0, run_dir=Path(tempfile.mkdtemp(prefix="bench-faults-")),
                         extra_args=extra_args, restart_policy=RestartPolicy(initial_backoff_s=0.2, max_backoff_s=1.0),
                         instance_ports={name: InstancePorts(find_free_port(), find_free_port())
                                         for name in CHURN_SCENARIOS.values()})
    stack = LocalStack(config)
    stack.start()
    return stack


def wait_recovered(stack: LocalStack, victim: str, restarts_before: int, timeout_s: float) -> float:
    """Seconds until the victim was restarted and every instance is registered."""
    started = time.monotonic()
    names = {child.name for child in stack.instances}
    while time.monotonic() - started < timeout_s:
        if num_restarts(stack, victim) > restarts_before and registered_ids(stack) == names:
            return time.monotonic() - started
        time.sleep(0.1)
    return float("nan")


def wait_registered(stack: LocalStack, started: float, timeout_s: float = 300.0) -> float:
    """Seconds from `started` until every instance is registered (a resumed one again)."""
    names = {child.name for child in stack.instances}
    while time.monotonic() - started < timeout_s:
        if registered_ids(stack) == names:
            return time.monotonic() - started
        time.sleep(0.1)
    return float("nan")


def inject_and_verify(stack: LocalStack, victim: str, signum: int, decoy: Decoy | None,
                      restarts_before: int) -> tuple[float, FaultEvidence]:
    """The scenario's signal (chaos_faults' fault kind for it), then (recovery s, its evidence).
    SIGSTOP: the tree stays stopped for HUNG_S, verified before SIGCONT; recovery from the stop
    until every instance is registered again. A kill or SIGTERM: recovery until the victim was
    restarted and every instance is registered, then verified (a new pid, registered)."""
    child = next(child for child in stack.children() if child.name == victim)
    started = time.monotonic()
    injected = chaos_faults.inject_into(stack, SIGNAL_KINDS[signum], child, random.Random(0),
                                        chaos_faults.FaultSettings(HUNG_S), decoy=decoy)
    if signum == signal.SIGSTOP:
        try:
            time.sleep(HUNG_S)  # the fault's length (a benchmark's fixed duration, not a synchronization)
            evidence = injected.verify()
        finally:
            injected.heal()
        return wait_registered(stack, started), evidence
    recovery_s = wait_recovered(stack, victim, restarts_before, CONTROL_WAIT_S if decoy else 300.0)
    evidence = injected.verify()
    evidence.checks.append(fault_checks.registered({c.name for c in stack.instances}, registered_ids(stack)))
    return recovery_s, evidence


def migrations(stack: LocalStack) -> int:
    http_address = stack.ready_info["gateway"]["http_address"]
    text = urllib.request.urlopen(f"http://{http_address}/metrics", timeout=10).read().decode()
    return sum(int(float(value)) for value in re.findall(r"^pdserve:migrations_total\{[^}]*\} (\S+)", text, re.M))


def p99_ms(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def window_latencies(results: list[StreamResult], start: float, end: float) -> tuple[float, float]:
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None and start <= r.started_at + r.ttft_s <= end + 30]
    gaps = [gap for r in results for at, gap in r.gaps if start <= at <= end]
    return p99_ms(ttfts), p99_ms(gaps)


def run_scenario(stack: LocalStack, stub, scenario: tuple, args: argparse.Namespace, seed: int,
                 decoy: Decoy | None = None) -> Row:
    name, victim, signum = scenario
    restarts_before, migrated_before = num_restarts(stack, victim), migrations(stack)
    with StreamingLoad(stub, args.num_requests, args.concurrency, prompt_tokens=(100, 300),
                       max_tokens=args.output_len, seed=seed, timeout_s=600) as load:
        load.wait_in_flight(min(4, args.concurrency), timeout_s=300)
        fault_at = time.monotonic()
        recovery_s, evidence = 0.0, None
        if victim is not None:
            recovery_s, evidence = inject_and_verify(stack, victim, signum, decoy, restarts_before)
        results = load.results()
    window_end = fault_at + recovery_s if victim is not None else max(r.ended_at for r in results)
    ttft, itl = window_latencies(results, fault_at, window_end)
    num_ok = sum(result.is_ok for result in results)
    longest_gap = max((gap for r in results for _, gap in r.gaps), default=0.0)
    notes = [f"longest gap in a stream {longest_gap:.1f} s"] if signum == signal.SIGSTOP else []
    notes += failures(results)[:3]
    return Row(name, num_ok, len(results) - num_ok, migrations(stack) - migrated_before, recovery_s, ttft, itl,
               fault_pull.stranded_blocks(stack), note="; ".join(notes), evidence=evidence)


def run_pull_scenario(stack: LocalStack, stub, args: argparse.Namespace, seed: int, decoy: Decoy | None = None) -> Row:
    """Two-turn chats; once a second turn has pulled from a decode instance, that holder is
    killed while a pull waits on it (benchmarks.fault_pull)."""
    migrated_before, sends_before = migrations(stack), fault_pull.peer_sends(stack)
    with ChatLoad(stub, max(1, args.num_requests // 2), args.concurrency, prompt_tokens=(200, 300),
                  max_tokens=args.output_len, seed=seed, timeout_s=600) as load:
        pulls_seen = fault_pull.wait_until(
            lambda: sum(fault_pull.peer_sends(stack).values()) > sum(sends_before.values()), 300, interval_s=0.2)
        sends_at_kill = fault_pull.peer_sends(stack)
        fault_at = time.monotonic()
        restarts_before = {name: num_restarts(stack, name) for name in sends_at_kill}
        kill = fault_pull.kill_holder_mid_pull(stack, stub, load, seed, aim_pid=decoy.pid if decoy else None)
        recovery_s = wait_recovered(stack, kill.victim, restarts_before[kill.victim],
                                    CONTROL_WAIT_S if decoy else 300.0)
        evidence = pull_kill_evidence(stack, kill, restarts_before[kill.victim])
        results = load.results()
    ttft, itl = window_latencies(results, fault_at, fault_at + recovery_s)
    num_ok = sum(result.is_ok for result in results)
    sends_after = fault_pull.peer_sends(stack)
    num_pulls = sum(sends_at_kill[n] - sends_before.get(n, 0) for n in sends_at_kill) + sum(
        sends_after[n] - (0 if n == kill.victim else sends_at_kill[n]) for n in sends_after)
    notes = [] if pulls_seen else ["no pull had happened in the load before the kill"]
    notes += [f"victim {kill.victim}; pull in flight at the kill: {'yes' if kill.pull_in_flight_at_kill else 'NO'}; "
              f"the pulled prompt: {'ok' if kill.probe_ok else 'FAILED'}, {kill.probe_peer_tokens} peer tokens, "
              f"greedy tokens {'equal' if kill.probe_correct else 'DIFFER from'} a cold run"]
    notes += [kill.note] if kill.note else []
    right = pull_verdict(kill, args.dtype)
    return Row(PULL_SCENARIO, num_ok, len(results) - num_ok, migrations(stack) - migrated_before, recovery_s,
               ttft, itl, fault_pull.stranded_blocks(stack), num_pulls, right, "; ".join(notes), evidence)


def run_churn_scenario(stack: LocalStack, stub, name: str, args: argparse.Namespace, seed: int) -> Row:
    """--churn-cycles times: --churn-streams streams start, the victim is killed once half of them
    run and restarted on its address (verified, benchmarks.harness.peer_churn), the streams end.
    Then the survivors' transport state and RSS against before the first cycle."""
    victim = CHURN_SCENARIOS[name]
    survivors = sorted(child.name for child in stack.instances if child.name != victim)
    before, migrated_before = peer_churn.survivors_state(stack, survivors), migrations(stack)
    evidence, results, recoveries = FaultEvidence(f"kill -9 x{args.churn_cycles}, same address", victim), [], []
    for cycle in range(args.churn_cycles):
        with StreamingLoad(stub, args.churn_streams, args.churn_streams, prompt_tokens=(100, 300),
                           max_tokens=args.output_len, seed=seed * 1000 + cycle, timeout_s=600) as load:
            load.wait_in_flight(max(1, args.churn_streams // 2), timeout_s=300)
            started = time.monotonic()
            cycle_evidence = peer_churn.kill_and_restart_in_place(stack, victim)
            recoveries.append(time.monotonic() - started)
            results += load.results()
        evidence.checks += [Check(f"cycle {cycle + 1}: {check.what}", check.observed, check.ok)
                            for check in cycle_evidence.checks]
    num_stranded = fault_pull.stranded_blocks(stack)
    after = peer_churn.survivors_state(stack, survivors)
    num_receivers = sum(child.role == "decode" for child in stack.instances)
    notes = peer_churn.leftovers(before, after, num_receivers) or ["survivors: no lingering transfer, no stale "
                                                                   "cached connection"]
    notes.append("survivors' RSS growth MiB: " + ", ".join(
        f"{n} {growth:+.0f}" for n, growth in peer_churn.rss_growth_mib(before, after).items()))
    notes.append("idle connections after: " + ", ".join(f"{n} {s.idle_endpoints} to {s.idle_addresses} address(es)"
                                                      for n, s in after.items()))
    notes += failures(results)[:3]
    num_ok = sum(result.is_ok for result in results)
    ttft, itl = window_latencies(results, 0.0, float("inf"))
    return Row(name, num_ok, len(results) - num_ok, migrations(stack) - migrated_before, max(recoveries), ttft, itl,
               num_stranded, note="; ".join(notes), evidence=evidence)


def run_storm_scenario(stack: LocalStack, stub, args: argparse.Namespace, seed: int) -> Row:
    """--storm-aborts cancelled calls (benchmarks.harness.abort_storm) while --num-requests streams
    run to completion; then the completed outputs against an offline fp32 run (fp32 only),
    blocks and reservations left, and the late writes the decode instances refused."""
    decode_metrics = [peer_churn.ready_info_of(child)["metrics_address"] for child in stack.instances
                      if child.role == "decode"]
    first_token_s = abort_storm.first_token_wait_s(stub, STORM_PROMPT_TOKENS)
    refused_before, migrated_before = abort_storm.late_writes_refused(decode_metrics), migrations(stack)
    started = time.monotonic()
    with StreamingLoad(stub, args.num_requests, args.concurrency, prompt_tokens=(100, 300),
                       max_tokens=args.output_len, seed=seed, timeout_s=1800) as load:
        storm = abort_storm.abort_storm(stub, args.storm_aborts, args.storm_concurrency, STORM_PROMPT_TOKENS,
                                        args.output_len, first_token_s, seed)
        results = load.results()
    storm_s = time.monotonic() - started
    num_stranded = fault_pull.stranded_blocks(stack)
    refused = abort_storm.late_writes_refused(decode_metrics) - refused_before
    num_cancelled = storm.num_aborts - storm.num_done_before_abort - sum(storm.errors.values())
    evidence = FaultEvidence(f"{args.storm_aborts} client aborts", "gateway clients", [
        Check("calls cancelled by their client before they ended (gRPC CANCELLED)",
              f"{num_cancelled} of {storm.num_aborts}; by phase {dict(storm.by_phase)}", num_cancelled > 0)])
    if args.dtype == "float32":
        wrong = abort_storm.wrong_outputs(abort_storm.completed_pairs(load, results), str(resolve_model(None)),
                                          args.output_len)
        right = f"{len(wrong)} of {sum(r.is_ok for r in results)} completed outputs differ from offline fp32"
    else:
        right = f"outputs not compared ({args.dtype} is not exact; use --dtype float32)"
    notes = [right, f"late writes refused {dict(refused) or 0}", f"first token ~{first_token_s:.2f} s",
             f"storm {storm_s:.0f} s", f"reservations held after: {reservations_held(stack)}"]
    notes += [f"abort errors {dict(storm.errors)}"] if storm.errors else []
    notes += failures(results)[:3]
    num_ok = sum(result.is_ok for result in results)
    ttft, itl = window_latencies(results, 0.0, float("inf"))
    return Row(STORM_SCENARIO, num_ok, len(results) - num_ok, migrations(stack) - migrated_before, 0.0, ttft, itl,
               num_stranded, note="; ".join(notes), evidence=evidence)


def reservations_held(stack: LocalStack) -> int:
    """Reservations still held on the decode instances (their GetStatus)."""
    total = 0
    for child in stack.instances:
        if child.role != "decode" or child.name not in stack.addresses:
            continue
        with grpc.insecure_channel(stack.addresses[child.name]) as channel:
            total += instance_pb2_grpc.InstanceStub(channel).GetStatus(instance_pb2.StatusRequest(),
                                                                       timeout=10).num_reserved
    return total


def pull_kill_evidence(stack: LocalStack, kill: "fault_pull.PullKill", restarts_before: int) -> FaultEvidence:
    """The holder's kill, verified as chaos_faults verifies a kill -9: a new pid, a restart, registered."""
    child = next(child for child in stack.instances if child.name == kill.victim)
    return FaultEvidence("kill -9 mid-pull", kill.victim, [
        *fault_checks.replaced(kill.victim, kill.killed, child.pid),
        fault_checks.restarted(kill.victim, restarts_before, num_restarts(stack, kill.victim)),
        fault_checks.registered({c.name for c in stack.instances}, registered_ids(stack))])


def pull_verdict(kill: "fault_pull.PullKill", dtype: str) -> str:
    """The pull the kill hit: in flight, then computed with the cold run's tokens. Only fp32 is
    exact: bf16 tokens may differ between differently batched runs without anything wrong."""
    if not (kill.pull_in_flight_at_kill and kill.probe_ok):
        return "NO"
    if kill.probe_correct:
        return "yes"
    return "NO" if dtype == "float32" else f"tokens differ ({dtype}: not exact; use --dtype float32)"


def format_table(rows: list[Row]) -> str:
    lines = ["| fault | verified | requests ok | failed | migrated | recovery s | TTFT p99 ms | ITL p99 ms "
             "| blocks stranded | peer pulls | killed pull recomputed right |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r.scenario} | {verified_cell(r.evidence)} | {r.num_ok} | {r.num_failed} | {r.num_migrated} | "
              f"{r.recovery_s:.1f} | {r.ttft_p99_ms:.0f} | {r.itl_p99_ms:.0f} | {r.num_stranded} | "
              f"{'-' if r.num_pulls is None else r.num_pulls} | {r.pulled_right} |" for r in rows]
    return "\n".join(lines)


def verified_cell(evidence: FaultEvidence | None) -> str:
    if evidence is None:
        return "-"
    return "yes" if evidence.is_verified else "NO"


def supervise_in_background(stack: LocalStack) -> threading.Event:
    stop_event = threading.Event()
    threading.Thread(target=stack.supervise, args=(stop_event,), daemon=True).start()
    return stop_event


@contextlib.contextmanager
def running(stack: LocalStack, run_dirs: list[Path]):
    """(stack, gateway stub) while the stack runs supervised; stopped afterwards."""
    run_dirs.append(stack.run_dir)
    stop_event = supervise_in_background(stack)
    try:
        with grpc.insecure_channel(stack.gateway_address) as channel:
            yield stack, gateway_pb2_grpc.GatewayStub(channel)
    finally:
        stop_event.set()
        stack.stop()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args()
    from benchmarks.machine import default_model_paths, print_machine

    print_machine(default_model_paths(args.dtype))
    every = [name for name, _, _ in SCENARIOS] + [PULL_SCENARIO, *CHURN_SCENARIOS, STORM_SCENARIO]
    selected = [name for name in every if not args.scenario or any(text in name for text in args.scenario)]
    if not selected:
        raise SystemExit(f"no scenario matches {args.scenario}; the scenarios: {every}")
    with misdirect.decoy() if args.control_misdirect else contextlib.nullcontext() as decoy:
        rows, run_dirs = run_selected(args, selected, decoy)
    control = "; CONTROL RUN: every fault aimed at a decoy (--control-misdirect)" if decoy else ""
    print(f"\n{args.num_requests} streaming requests per scenario at concurrency {args.concurrency}, "
          f"{args.output_len} output tokens, {args.dtype}{control}; logs in "
          f"{', '.join(str(d / 'logs') for d in run_dirs)}\n")
    print(format_table(rows))
    for row in rows:
        if row.note:
            print(f"\n{row.scenario}: {row.note}")
    evidence = [row.evidence for row in rows if row.evidence is not None]
    print("\nEvidence that each fault took effect:\n" + "\n".join(
        line for found in evidence for line in found.lines()))
    print(fault_evidence.summary(evidence))
    raise SystemExit(fault_evidence.exit_status(evidence))


def run_selected(args: argparse.Namespace, selected: list[str], decoy: Decoy | None) -> tuple[list[Row], list[Path]]:
    rows, run_dirs = [], []
    scenarios = [s for s in SCENARIOS if s[0] in selected]
    churn = [name for name in CHURN_SCENARIOS if name in selected]
    if scenarios or churn or STORM_SCENARIO in selected:
        with running(start_stack(args.dtype), run_dirs) as (stack, stub):
            for seed, scenario in enumerate(scenarios, start=1):
                rows.append(run_scenario(stack, stub, scenario, args, seed, decoy))
                print_row(rows[-1])
            for seed, name in enumerate(churn, start=len(SCENARIOS) + 2):
                if decoy is not None:
                    print(f"{name}: skipped in a control run (its kills are verified per cycle)")
                    continue
                rows.append(run_churn_scenario(stack, stub, name, args, seed))
                print_row(rows[-1])
            if STORM_SCENARIO in selected and decoy is None:
                rows.append(run_storm_scenario(stack, stub, args, len(SCENARIOS) + 5))
                print_row(rows[-1])
    if PULL_SCENARIO in selected:
        stack = start_stack(args.dtype, tuple(fault_pull.STACK_INSTANCE_ARGS), tuple(fault_pull.STACK_GATEWAY_ARGS))
        with running(stack, run_dirs) as (stack, stub):
            rows.append(run_pull_scenario(stack, stub, args, len(SCENARIOS) + 1, decoy))
            print_row(rows[-1])
    return rows, run_dirs


def print_row(row: Row) -> None:
    print(format_table([row]).splitlines()[-1], flush=True)
    for line in ([row.note] if row.note else []) + (row.evidence.lines() if row.evidence else []):
        print(f"  {line}", flush=True)


if __name__ == "__main__":
    main()
