"""What request tracing costs: the serving benchmark with tracing off and on, same run
(`make bench-tracing`, `python -m benchmarks.tracing_cost [flags]`).

Each configuration runs on a disaggregated stack of its own (gateway, 1 prefill, 1 decode,
each instance with its engine-core process; pinned as `make bench` pins its disaggregated
mode: prefill, gateway, Redis and the load generator on CPU 0, decode on CPU 1), started for
each of its runs and stopped after it (one stack in memory at a time), or, with
`--all-stacks-up`, all started before the first run and kept up (fewer starts, three stacks'
memory; the idle ones only heartbeat):

  off        no --otlp-traces-endpoint (the default: no SDK, no interceptor, nothing on the wire)
  on         every service and engine core exporting every trace (ratio 1.0) over OTLP/gRPC
  on-0.1     the same, sampling 10% of traces (the others still propagate their context)

The traced stacks export to benchmarks/otlp_sink.py, a receiver in a process of its own that
counts spans (a real collector would run elsewhere; this one shares CPU 0). Runs are
interleaved: each round runs every configuration once, in a rotated order, each on a fresh
prompt set (no prefix-cache hits), so the machine's drift and other users' load fall on all
of them alike; the table gives each configuration's median over rounds and the spread
(min-max), which says how noisy the machine was. Only one stack serves at a time.

Workload (defaults): 24 random-token prompts of 128-256 tokens, 64 output tokens, EOS
ignored, greedy, Poisson arrivals at 2 requests/s, through the gRPC gateway; each instance has
a 512-block KV pool and no host tier.
"""

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from services.bench.clients import ClientOptions  # noqa: E402
from services.bench.datasets import LengthRange  # noqa: E402
from services.bench.runner import LoadShape, RunResult  # noqa: E402
from services.bench.sweep import run_sweep  # noqa: E402
from services.bench.vocabulary import load_bench_tokenizer  # noqa: E402
from services.bench.workload import WorkloadSpec, sweep_workloads  # noqa: E402
from benchmarks.machine import default_model_paths, print_machine  # noqa: E402
from benchmarks.serve_compare import PREFILL_CPUS, client_cpus  # noqa: E402
from services.launcher import LocalStack, StackConfig  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments  # noqa: E402

logger = logging.getLogger("benchmarks.tracing_cost")
NUM_WARMUPS = 2
# A KV pool of 512 blocks (8192 tokens, ~190 MB for SmolLM2) and no host tier: room for the
# workload, little memory (the machine is shared).
INSTANCE_ARGS = ("--num-blocks", "512", "--kv-host-tier-gb", "0")


@dataclass(frozen=True)
class TracingSetting:
    name: str
    sample_ratio: float | None  # None: tracing off


SETTINGS = {"off": TracingSetting("off", None), "on": TracingSetting("on", 1.0),
            "on-0.1": TracingSetting("on-0.1", 0.1)}
# (figure, how it is read from a run's summary)
FIGURES = (("TTFT p50 ms", lambda s: s.ttft.percentiles_ms["p50"]),
           ("TTFT p99 ms", lambda s: s.ttft.percentiles_ms["p99"]),
           ("ITL p50 ms", lambda s: s.itl.percentiles_ms["p50"]),
           ("ITL p99 ms", lambda s: s.itl.percentiles_ms["p99"]),
           ("out tok/s", lambda s: s.output_throughput))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--rounds", type=int, default=3, help="runs of each setting, interleaved")
    parser.add_argument("--request-rate", type=float, default=2.0)
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument("--input-len", type=int, nargs=2, default=[128, 256], metavar=("LOW", "HIGH"))
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    add_engine_arguments(parser, "dtype", "model")
    parser.add_argument("--all-stacks-up", action="store_true",
                        help="start every configuration's stack once and keep them all up")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="results.json goes here (default: a new /tmp/pdserve-bench-tracing-* folder)")
    return parser.parse_args()


def stack_config(setting: TracingSetting, endpoint: str, args: argparse.Namespace, run_dir: Path) -> StackConfig:
    tracing = {} if setting.sample_ratio is None else {"otlp_traces_endpoint": endpoint,
                                                       "otlp_traces_sample_ratio": setting.sample_ratio}
    return StackConfig(model=args.model, dtype=args.dtype, gateway_port=0, gateway_http_port=-1, run_dir=run_dir,
                       ready_timeout_s=300.0, stop_grace_s=10.0,
                       env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
                       num_prefill=1, num_decode=1, num_threads=1, prefill_cpus=PREFILL_CPUS, decode_cpus=(1,),
                       gateway_cpus=PREFILL_CPUS, extra_args={"instance": list(INSTANCE_ARGS)}, **tracing)


class SpanSink:
    """benchmarks/otlp_sink.py in a child process: its endpoint, and how many spans it got."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-m", "benchmarks.otlp_sink"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.endpoint = self.process.stdout.readline().split()[1]

    def num_spans(self) -> int:
        self.process.stdin.write("count\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline().split()[1])

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


def start_stack(exit_stack: contextlib.ExitStack, name: str, endpoint: str, args: argparse.Namespace,
                suffix: str = "") -> LocalStack:
    started = time.perf_counter()
    stack = exit_stack.enter_context(LocalStack(stack_config(SETTINGS[name], endpoint, args,
                                                             args.out_dir / f"stack-{name}{suffix}")))
    stack.start()
    logger.warning("%s stack SERVING after %.1f s", name, time.perf_counter() - started)
    return stack


def run_once(stack: LocalStack, prompts, rate: float, seed: int, label: str, warmup) -> RunResult:
    options = ClientOptions("pdserve-grpc", stack.gateway_address, ignore_eos=True, temperature=0.0)
    with client_cpus("disaggregated"):
        [run] = asyncio.run(run_sweep(options, [prompts], [LoadShape(rate, seed=seed)], None, label, warmup,
                                      show_progress=False))
    return run


def rotated(names: list[str], round_index: int) -> list[str]:
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def format_table(runs: dict[str, list[RunResult]]) -> str:
    header = "| setting | " + " | ".join(f"{name} (median; min-max)" for name, _ in FIGURES) + " | failed |"
    lines = [header, "|" + "---|" * (len(FIGURES) + 2)]
    for name, results in runs.items():
        cells = []
        for _, read in FIGURES:
            values = [read(run.summary) for run in results]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        failed = sum(run.summary.num_failed for run in results)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {failed} |")
    return "\n".join(lines)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args()
    args.out_dir = args.out_dir or Path(f"/tmp/pdserve-bench-tracing-{time.strftime('%Y%m%d-%H%M%S')}")
    machine = print_machine(default_model_paths(args.dtype), probe_onednn=False)
    names = list(args.settings)
    spec = WorkloadSpec(num_prompts=args.num_prompts, input_len=LengthRange(*args.input_len),
                        output_len=LengthRange(args.output_len, args.output_len), seed=args.seed)
    warmup, prompt_sets = sweep_workloads(spec, load_bench_tokenizer(args.model), args.rounds * len(names),
                                          NUM_WARMUPS)
    runs: dict[str, list[RunResult]] = {name: [] for name in names}
    loads: list[dict] = []
    sink = SpanSink()
    try:
        with contextlib.ExitStack() as stacks:
            kept = {}
            if args.all_stacks_up:
                for name in names:
                    kept[name] = start_stack(stacks, name, sink.endpoint, args)
            for round_index in range(args.rounds):
                for name in rotated(names, round_index):
                    prompts = prompt_sets[len(loads)]
                    with contextlib.ExitStack() as this_run:
                        stack = kept.get(name) or start_stack(this_run, name, sink.endpoint, args,
                                                              f"-{round_index}")
                        load_before = os.getloadavg()
                        run = run_once(stack, prompts, args.request_rate, args.seed + len(loads),
                                       f"{name} round {round_index}",
                                       warmup if round_index == 0 or not kept else None)
                    runs[name].append(run)
                    loads.append({"setting": name, "round": round_index, "load_before": load_before,
                                  "load_after": os.getloadavg()})
                    summary = run.summary
                    logger.warning("%s round %d: TTFT p50 %.0f ms, ITL p50 %.1f ms, %.1f tok/s, %d failed "
                                   "(load %.1f)", name, round_index, summary.ttft.percentiles_ms["p50"],
                                   summary.itl.percentiles_ms["p50"], summary.output_throughput,
                                   summary.num_failed, load_before[0])
        num_spans = sink.num_spans()
    finally:
        sink.close()
    table = format_table(runs)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine, "workload": {"num_prompts": args.num_prompts, "input_len": args.input_len,
                                               "output_len": args.output_len, "request_rate": args.request_rate,
                                               "rounds": args.rounds, "dtype": args.dtype},
              "spans_received": num_spans, "loads": loads, "table": table,
              "runs": {name: [{"ttft_ms": r.summary.ttft.percentiles_ms, "itl_ms": r.summary.itl.percentiles_ms,
                               "output_throughput": r.summary.output_throughput,
                               "num_failed": r.summary.num_failed} for r in results]
                       for name, results in runs.items()}}
    (args.out_dir / "results.json").write_text(json.dumps(report, indent=2))
    print(table)
    load_min = min(entry["load_before"][0] for entry in loads)
    load_max = max(entry["load_before"][0] for entry in loads)
    print(f"\n{num_spans} spans received by the sink; 1-minute load average {load_min:.1f}-{load_max:.1f} "
          f"before the runs; results in {args.out_dir}")


if __name__ == "__main__":
    main()
