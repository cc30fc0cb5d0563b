"""Colocated vs disaggregated serving on the same workload and machine (`make bench`).

Run by `make bench` (`python -m benchmarks.serve_compare [flags]`). For each mode it starts
the local stack with services.launcher (Redis, the engine instances, a gateway), waits until
every service is SERVING, runs `pdserve bench serve`'s sweep over the request rates through
the gRPC gateway, and stops the stack:

  colocated       one colocated instance doing prefill and decode, 2 torch threads, unpinned
  disaggregated   one prefill instance pinned to CPU 0 and one decode instance pinned to
                  CPU 1, 1 torch thread each; the gateway, Redis and this load generator
                  share CPU 0, so CPU 1 only decodes (as a decode machine would)

Workload: 64 random-token prompts of 128-256 tokens (a fresh set per rate, so no prefix-cache
hits), 128 output tokens, EOS ignored, greedy, Poisson arrivals at each rate. Prints one table
(benchmarks/serve_compare_table.py) and writes
results.json (every request), summary.json (figures only), table.md, the latency CDFs per
rate and the sweep plot into --out-dir. `python -m benchmarks.serve_stalls results.json`
then tells how many slow inter-token gaps contain another request's first token.
"""

import argparse
import asyncio
import contextlib
import logging
from benchmarks.machine import default_model_paths, print_machine
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.serve_compare_table import format_compare_table  # noqa: E402
from services.launcher import LocalStack, StackConfig  # noqa: E402
from services.bench.clients import ClientOptions  # noqa: E402
from services.bench.datasets import LengthRange  # noqa: E402
from services.bench.metrics import parse_goodput  # noqa: E402
from services.bench.plots import plot_latency_cdfs, plot_rate_sweep  # noqa: E402
from services.bench.report import write_result_json  # noqa: E402
from services.bench.runner import LoadShape, RunResult  # noqa: E402
from services.bench.sweep import run_sweep  # noqa: E402
from services.bench.vocabulary import load_bench_tokenizer  # noqa: E402
from services.bench.workload import WorkloadSpec, sweep_workloads  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments  # noqa: E402

logger = logging.getLogger("benchmarks.serve_compare")
MODES = ("colocated", "disaggregated")
NUM_WARMUPS = 2
# Disaggregated mode: the prefill instance, the gateway, Redis and the load generator share CPU 0;
# the decode instance has CPU 1 to itself.
PREFILL_CPUS = (0,)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--request-rate", type=float, nargs="+", default=[1, 2, 4, 8], metavar="RATE")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, nargs=2, default=[128, 256], metavar=("LOW", "HIGH"))
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--goodput", nargs="+", default=["ttft:1000", "tpot:100"], metavar="METRIC:MS")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--seed", type=int, default=0)
    add_engine_arguments(parser, "dtype", "model")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="results.json and PNGs go here (default: a new /tmp/pdserve-bench-* folder)")
    parser.add_argument("--disable-tqdm", action="store_true")
    return parser.parse_args()


def stack_config(mode: str, args: argparse.Namespace, run_dir: Path) -> StackConfig:
    """The stack of one mode; every listener on an ephemeral loopback port, no HTTP door."""
    common = dict(model=args.model, dtype=args.dtype, gateway_port=0, gateway_http_port=-1,
                  run_dir=run_dir, ready_timeout_s=300.0, stop_grace_s=10.0,
                  env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    if mode == "colocated":
        return StackConfig(colocated=True, num_decode=1, num_threads=2, **common)
    return StackConfig(num_prefill=1, num_decode=1, num_threads=1, prefill_cpus=PREFILL_CPUS, decode_cpus=(1,),
                       gateway_cpus=PREFILL_CPUS, **common)


@contextlib.contextmanager
def client_cpus(mode: str) -> Iterator[None]:
    """Disaggregated: this process (the load generator) shares the prefill core with the gateway
    and Redis, so the decode core only decodes, as on a decode machine of its own. Colocated:
    everything floats over both cores, as the colocated instance does."""
    previous = os.sched_getaffinity(0)
    if mode == "disaggregated":
        os.sched_setaffinity(0, PREFILL_CPUS)
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


def run_mode(mode: str, args: argparse.Namespace, workloads, slos: dict[str, float]) -> list[RunResult]:
    """Start the mode's stack, run the sweep against its gateway, stop the stack."""
    loads = [LoadShape(rate, seed=args.seed) for rate in args.request_rate]
    started = time.perf_counter()
    with LocalStack(stack_config(mode, args, args.out_dir / f"stack-{mode}")) as stack:
        stack.start()
        logger.warning("%s stack SERVING after %.1f s; logs in %s", mode, time.perf_counter() - started,
                       stack.run_dir / "logs")
        options = ClientOptions("pdserve-grpc", stack.gateway_address, ignore_eos=True, temperature=0.0)
        warmup_prompts, prompt_sets = workloads
        with client_cpus(mode):
            runs = asyncio.run(run_sweep(options, prompt_sets, loads, slos, mode, warmup_prompts,
                                         show_progress=not args.disable_tqdm, on_run=_log_run))
    return runs


def _log_run(run: RunResult) -> None:
    summary = run.summary
    logger.warning("%s: %.1f s, %d ok, %d failed, %.0f output tok/s, ITL p99 %.0f ms", run.label,
                   summary.duration_s, summary.num_completed, summary.num_failed, summary.output_throughput,
                   summary.itl.percentiles_ms["p99"])


def write_outputs(args: argparse.Namespace, series: dict[str, list[RunResult]], config: dict) -> None:
    all_runs = [run for runs in series.values() for run in runs]
    write_result_json(args.out_dir / "results.json", config, all_runs)
    write_result_json(args.out_dir / "summary.json", config, all_runs, with_requests=False)
    for index, rate in enumerate(args.request_rate):
        name = "inf" if math.isinf(rate) else f"{rate:g}"
        plot_latency_cdfs([runs[index] for runs in series.values()], args.out_dir / f"latency_cdfs_rate_{name}.png",
                          f"latency CDFs at {name} req/s")
    if len(args.request_rate) > 1:
        plot_rate_sweep(series, args.out_dir / "rate_sweep.png", "colocated vs disaggregated")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args()
    args.out_dir = args.out_dir or Path(f"/tmp/pdserve-bench-{time.strftime('%Y%m%d-%H%M%S')}")
    print_machine(default_model_paths())
    spec = WorkloadSpec(num_prompts=args.num_prompts, input_len=LengthRange(*args.input_len),
                        output_len=LengthRange(args.output_len, args.output_len), seed=args.seed)
    workloads = sweep_workloads(spec, load_bench_tokenizer(args.model), len(args.request_rate), NUM_WARMUPS)
    slos = parse_goodput(args.goodput)
    series = {mode: run_mode(mode, args, workloads, slos) for mode in args.modes}
    config = {"workload": {"num_prompts": spec.num_prompts, "input_len": args.input_len,
                           "output_len": args.output_len, "seed": args.seed},
              "goodput_ms": {name: limit * 1000 for name, limit in slos.items()}, "dtype": args.dtype,
              "modes": {mode: repr(stack_config(mode, args, args.out_dir)) for mode in args.modes},
              "num_cpus": os.cpu_count(), "load_average": os.getloadavg()}
    write_outputs(args, series, config)
    table = format_compare_table(series, args.request_rate)
    (args.out_dir / "table.md").write_text(table + "\n")
    print(table)
    print(f"\nresults and plots in {args.out_dir}")


if __name__ == "__main__":
    main()
