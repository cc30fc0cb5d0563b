"""`pdserve bench serve [options]`: load-test a running server and report latency figures.

Sends a seeded workload (random, shared-prefix or JSONL prompts) to pdserve's gateway over
gRPC or to any OpenAI-compatible server over SSE, at each `--request-rate` in turn (Poisson
arrivals) or at a fixed `--max-concurrency`, then prints throughput, goodput, TTFT, TPOT, ITL
and end-to-end latency per rate; optionally writes a result JSON and PNG plots.
"""

import argparse
import os
import sys
from pathlib import Path

DEFAULT_GATEWAY = "127.0.0.1:50051"
DEFAULT_BASE_URL = "http://127.0.0.1:8000"
BACKENDS = ("pdserve-grpc", "openai", "openai-chat")
DATASETS = ("random", "shared-prefix", "file")
# Imported by services/bench, installed by the `bench` extra only.
BENCH_EXTRA_MODULES = ("tqdm", "matplotlib", "httpx2")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Called by services.cli.main.build_parser: registers `bench` and its `serve` subcommand."""
    bench = subparsers.add_parser("bench", help="benchmark a running server")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    parser = bench_commands.add_parser(
        "serve", help="load-test a gateway or an OpenAI-compatible server",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_target_arguments(parser)
    _add_workload_arguments(parser)
    _add_load_arguments(parser)
    _add_output_arguments(parser)
    parser.set_defaults(run=run)


def _add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=BACKENDS, default="pdserve-grpc",
                        help="pdserve-grpc (Generate, token ids), openai (/v1/completions) or "
                             "openai-chat (/v1/chat/completions); default pdserve-grpc")
    parser.add_argument("--gateway", default=os.environ.get("PDSERVE_GATEWAY", DEFAULT_GATEWAY),
                        help=f"gRPC gateway address (default $PDSERVE_GATEWAY or {DEFAULT_GATEWAY})")
    parser.add_argument("--base-url", default=DEFAULT_BASE_URL,
                        help=f"OpenAI-compatible server (default {DEFAULT_BASE_URL})")
    parser.add_argument("--model", default=None,
                        help="model name sent with each request (default: the server's; openai: "
                             "the first of /v1/models)")
    parser.add_argument("--tokenizer", default=None,
                        help="HF folder or GGUF whose tokenizer builds prompts (default: bundled SmolLM2)")


def _add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset-name", choices=DATASETS, default="random", help="default random")
    parser.add_argument("--dataset-path", type=Path, help="JSONL for --dataset-name file: "
                        '{"prompt": ..} or {"prompt_token_ids": [..]}, optional "output_len"')
    parser.add_argument("--num-prompts", type=int, default=64, help="requests per run (default 64)")
    parser.add_argument("--random-input-len", type=int, nargs="+", default=[128, 256], metavar="LEN",
                        help="prompt length, LEN or LOW HIGH (default 128 256)")
    parser.add_argument("--random-output-len", "--output-len", dest="output_len", type=int, nargs="+",
                        default=[128], metavar="LEN", help="output length, LEN or LOW HIGH (default 128)")
    parser.add_argument("--shared-prefix-num-prefixes", type=int, default=4, help="default 4")
    parser.add_argument("--shared-prefix-len", type=int, default=512, help="tokens per prefix (default 512)")
    parser.add_argument("--shared-prefix-suffix-len", type=int, default=64, help="default 64")
    parser.add_argument("--seed", type=int, default=0, help="seeds the prompts and arrivals (default 0)")
    parser.add_argument("--ignore-eos", action="store_true", help="generate exactly the output length")
    parser.add_argument("--temperature", type=float, default=0.0, help="default 0 (greedy)")


def _add_load_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--request-rate", type=float, nargs="+", default=[float("inf")], metavar="RATE",
                        help="requests/s, Poisson arrivals; several = a sweep; inf = all at once (default inf)")
    parser.add_argument("--burstiness", type=float, default=1.0,
                        help="gamma shape of the arrival gaps: 1 = Poisson, <1 burstier (default 1)")
    parser.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight")
    parser.add_argument("--num-warmups", type=int, default=1, help="short requests sent first (default 1)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per-request deadline (default 600)")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--goodput", nargs="+", default=[], metavar="METRIC:MS",
                        help="SLOs for goodput, e.g. ttft:1000 tpot:100 (metrics ttft, tpot, e2el)")
    parser.add_argument("--percentiles", type=float, nargs="+", default=[50, 90, 99], help="default 50 90 99")
    parser.add_argument("--result-json", type=Path, help="write config, summaries and every request here")
    parser.add_argument("--plot-dir", type=Path, help="write PNG latency CDFs (and sweep plots) here")
    parser.add_argument("--label", default="", help="name of this server in titles and plots")
    parser.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    try:
        from services.cli.bench_run import run_bench_serve
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        if missing not in BENCH_EXTRA_MODULES:
            raise
        print(f"pdserve bench: error: {missing} is missing; the benchmark harness needs the `bench`"
              " extra: pip install 'pdserve[bench]' (make setup installs it)", file=sys.stderr)
        return 2
    return run_bench_serve(args)
