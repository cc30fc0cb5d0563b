"""Saturation: N streaming chats sent at once, pdserve against `vllm serve` (`make bench-saturation`).

`python -m benchmarks.saturation --vllm-python VENV/bin/python [flags]` sends each burst of
`--burst-size` (default 128 then 512) requests at the same instant, as `vllm bench serve
--request-rate inf` does, as streaming `/v1/chat/completions` with the serving workload of
benchmarks/serve_vs_vllm.py (random-token prompts of 128-256 tokens as text, 128 output tokens,
greedy, EOS ignored). Servers run in interleaved rounds (`--rounds`, default 2: vllm, pdserve,
vllm, pdserve): each round starts every server of `--servers` in turn (benchmarks/serve_servers.py:
`vllm serve` in its own virtualenv, pdserve as `make run` starts it), sends two warm-up requests,
runs every burst size and stops it, so the machine's drift falls on both servers alike. Every
server of a round gets the same prompts; each round and burst size its own (no prefix-cache hits).

Prints per burst size, server and round: completed, failed (and how many of them were refused
with 429), output and total tok/s, TTFT and ITL p50/p99; then each server's median over rounds
and pdserve's medians over vLLM's (saturation_report.py). Writes results.json (every request),
summary.json and table.md into --out-dir. Exit status 1 only when a server did not start: a
failed or refused request is a result here.
"""

import argparse
import logging
import math
import os
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from services.bench.datasets import BenchPrompt, LengthRange  # noqa: E402
from services.bench.report import write_result_json  # noqa: E402
from services.bench.runner import LoadShape, RunResult  # noqa: E402
from services.bench.workload import WorkloadSpec, sweep_workloads  # noqa: E402
from benchmarks.saturation_report import format_saturation_table  # noqa: E402
from benchmarks.serve_servers import ServerStartError  # noqa: E402
from benchmarks.serve_vs_vllm import (NUM_WARMUPS, add_server_arguments, check_server_arguments,  # noqa: E402
                                      run_server, server_options)
from shared.errors import ConfigurationError  # noqa: E402

logger = logging.getLogger("benchmarks.saturation")
# Streaming chats, as `vllm bench serve --backend openai-chat` sends them.
BACKEND = "openai-chat"
Workloads = tuple[list[BenchPrompt], list[list[BenchPrompt]]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parsed and checked flags; raises ConfigurationError naming the flag."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--burst-size", type=int, nargs="+", default=[128, 512], metavar="N",
                        help="requests sent at once, one burst per size (default 128 512)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every server, interleaved (default 2)")
    args = parser.parse_args(argv)
    check_server_arguments(args)
    if any(size < 1 for size in args.burst_size) or len(set(args.burst_size)) != len(args.burst_size):
        raise ConfigurationError("burst-size", f"each size once and >= 1, got {args.burst_size}")
    if args.rounds < 1:
        raise ConfigurationError("rounds", f"must be >= 1, got {args.rounds}")
    return args


def workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    """serve_vs_vllm's workload with this run's lengths and seed (the burst sizes set the counts)."""
    return WorkloadSpec(input_len=LengthRange(*args.input_len),
                        output_len=LengthRange(args.output_len, args.output_len), seed=args.seed)


def burst_loads(args: argparse.Namespace) -> list[LoadShape]:
    """One load per burst size: every request sent at once (request rate inf)."""
    return [LoadShape(math.inf, seed=args.seed) for _ in args.burst_size]


def burst_workloads(spec: WorkloadSpec, tokenizer, burst_sizes: list[int], num_rounds: int) -> list[Workloads]:
    """Per round: (warm-up prompts, one prompt set per burst size), with prompt text for chat.
    Every prompt set is drawn with a seed of its own (sweep_workloads), so no burst is served
    from a prefix cache another one filled."""
    num_sets = len(burst_sizes) * num_rounds
    warmup, prompt_sets = sweep_workloads(replace(spec, num_prompts=max(burst_sizes)), tokenizer, num_sets,
                                          NUM_WARMUPS, needs_text=True)
    sizes = burst_sizes * num_rounds
    trimmed = [prompts[:size] for prompts, size in zip(prompt_sets, sizes)]
    per_round = len(burst_sizes)
    return [(warmup, trimmed[index * per_round:(index + 1) * per_round]) for index in range(num_rounds)]


def run_round(round_index: int, args: argparse.Namespace, workloads: Workloads,
              results: dict[str, dict[int, list[RunResult]]], broken: set[str]) -> None:
    """Every server once, in --servers order, each through every burst size; a server that does
    not start is noted in `broken` and skipped in later rounds."""
    for name in args.servers:
        if name in broken:
            continue
        try:
            runs = run_server(name, args, workloads, server_options(args), burst_loads(args),
                              args.out_dir / f"round-{round_index}" / f"server-{name}", BACKEND,
                              f"{name} round {round_index}")
        except ServerStartError as error:  # the other servers still run and are reported
            logger.error("%s: %s", name, error)
            broken.add(name)
            continue
        by_size = results.setdefault(name, {size: [] for size in args.burst_size})
        for size, run in zip(args.burst_size, runs, strict=True):
            run.label = f"{name} round {round_index} N={size}"  # every burst's rate is inf: name its size
            by_size[size].append(run)


def run_config(args: argparse.Namespace) -> dict:
    """What results.json records about the run besides the figures."""
    return {"workload": {"backend": BACKEND, "burst_sizes": args.burst_size, "rounds": args.rounds,
                         "input_len": args.input_len, "output_len": args.output_len, "seed": args.seed},
            "servers": args.servers, "dtype": args.dtype, "vllm_python": str(args.vllm_python),
            "vllm_args": args.vllm_args, "num_cpus": os.cpu_count(), "load_average": os.getloadavg()}


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    args.out_dir = args.out_dir or Path(f"/tmp/pdserve-saturation-{time.strftime('%Y%m%d-%H%M%S')}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    from services.bench.vocabulary import load_bench_tokenizer
    from benchmarks.machine import default_model_paths, print_machine

    print_machine(default_model_paths())
    rounds = burst_workloads(workload_spec(args), load_bench_tokenizer(args.model), args.burst_size, args.rounds)
    results: dict[str, dict[int, list[RunResult]]] = {}
    broken: set[str] = set()
    for round_index, workloads in enumerate(rounds):
        run_round(round_index, args, workloads, results, broken)
    if not results:
        raise SystemExit(f"no server started: {', '.join(sorted(broken))}")
    all_runs = [run for by_size in results.values() for runs in by_size.values() for run in runs]
    write_result_json(args.out_dir / "results.json", run_config(args), all_runs)
    write_result_json(args.out_dir / "summary.json", run_config(args), all_runs, with_requests=False)
    table = format_saturation_table(results, args.burst_size)
    (args.out_dir / "table.md").write_text(table + "\n")
    print(table)
    print(f"\nresults in {args.out_dir}")
    if broken:
        print(f"did not start: {', '.join(sorted(broken))}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
