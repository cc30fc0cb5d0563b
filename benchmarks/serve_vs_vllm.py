"""pdserve against `vllm serve` on the same workload, back to back (`make bench-vllm-serve`).

`python -m benchmarks.serve_vs_vllm --vllm-python VENV/bin/python [flags]`: for each server
of `--servers` in turn (default: vllm, then pdserve as `make run` starts it; other pdserve
layouts in benchmarks/serve_servers.py) it starts the server, waits until its HTTP API
answers, sends two warm-up requests, runs `pdserve bench serve`'s load at each request rate
through the OpenAI client (streaming `/v1/completions`, prompts as token ids) and stops it.
Every server gets the same prompts and the same arrival times: random-token prompts of
128-256 tokens (a fresh set per rate), 128 output tokens, greedy, EOS ignored, Poisson
arrivals from --seed. The default sweep is 1, 2, 4, 6 and 8 req/s. Prints one table (output
tok/s, TTFT and ITL p50/p99, ITL max, ok/failed per server, pdserve/vLLM ratios and issue 23's
targets), then each server's SLO attainment per rate and its goodput (the highest rate at which
>= 90% of requests meet TTFT <= 1 s and TPOT <= 150 ms; --goodput-* flags; serve_goodput.py),
and writes results.json (every request), summary.json, goodput.json and table.md into --out-dir.

vLLM is never a pdserve dependency: it runs with the interpreter of its own virtualenv
(`--vllm-python` or PDSERVE_VLLM_PYTHON; how to install it: docs/performance.md) on the HF
folder pdserve converts the model to.
"""

import argparse
import asyncio
import json
import logging
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from services.bench.clients import ClientOptions  # noqa: E402
from services.bench.clients.openai_client import first_model_id  # noqa: E402
from services.bench.datasets import LengthRange  # noqa: E402
from services.bench.report import write_result_json  # noqa: E402
from services.bench.runner import LoadShape, RunResult  # noqa: E402
from services.bench.sweep import run_sweep  # noqa: E402
from services.bench.workload import WorkloadSpec, sweep_workloads  # noqa: E402
from benchmarks.serve_goodput import GoodputSLO, goodput_document  # noqa: E402
from benchmarks.serve_servers import SERVERS, ServerOptions, ServerStartError, open_server  # noqa: E402
from benchmarks.serve_vs_vllm_table import format_table  # noqa: E402
from shared.errors import ConfigurationError  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments  # noqa: E402

logger = logging.getLogger("benchmarks.serve_vs_vllm")
NUM_WARMUPS = 2
# p100 is the longest gap, shown beside p99 in the table.
PERCENTILES = (50.0, 90.0, 99.0, 100.0)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every pdserve-against-vLLM benchmark shares: the servers, vLLM's interpreter and
    flags, the serving workload's lengths, the model, the output folder (also benchmarks/saturation.py)."""
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=["vllm", "pdserve"],
                        help="started in this order (default: vllm pdserve)")
    parser.add_argument("--vllm-python", type=Path, default=os.environ.get("PDSERVE_VLLM_PYTHON") or None,
                        help="python of vLLM's own virtualenv (env PDSERVE_VLLM_PYTHON)")
    parser.add_argument("--vllm-arg", dest="vllm_args", action="append", default=[], metavar="ARG",
                        help="extra `vllm serve` argument (repeatable; --vllm-arg=--flag for dash-led ones)")
    parser.add_argument("--vllm-memory-utilization", type=float, default=0.15,
                        help="vLLM's --gpu-memory-utilization (on CPU: its share of RAM; default 0.15)")
    parser.add_argument("--input-len", type=int, nargs=2, default=[128, 256], metavar=("LOW", "HIGH"))
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0, help="seeds the prompts and the arrivals")
    add_engine_arguments(parser, "dtype", "model")
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds for a server to start")
    parser.add_argument("--request-timeout", type=float, default=600.0,
                        help="seconds a request may wait for its next byte before it counts as failed (default 600)")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="results go here (default: a new /tmp/pdserve-* folder)")
    parser.add_argument("--disable-tqdm", action="store_true")


def check_server_arguments(args: argparse.Namespace) -> None:
    """Raises ConfigurationError naming the first bad flag of add_server_arguments'."""
    if "vllm" in args.servers and args.vllm_python is None:
        raise ConfigurationError("vllm-python", "is required when --servers includes vllm "
                                                "(or set PDSERVE_VLLM_PYTHON)")
    if args.vllm_python is not None and "vllm" in args.servers and not args.vllm_python.is_file():
        raise ConfigurationError("vllm-python", f"{args.vllm_python} is not a file")
    if len(set(args.servers)) != len(args.servers):
        raise ConfigurationError("servers", f"each server once, got {' '.join(args.servers)}")
    if args.output_len < 1:
        raise ConfigurationError("output-len", "must be >= 1")
    low, high = args.input_len
    if not 1 <= low <= high:
        raise ConfigurationError("input-len", f"needs 1 <= LOW <= HIGH, got {low} {high}")
    if not args.request_timeout > 0:
        raise ConfigurationError("request-timeout", f"must be > 0, got {args.request_timeout}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--request-rate", type=float, nargs="+", default=[1, 2, 4, 6, 8], metavar="RATE",
                        help="the sweep (default 1 2 4 6 8 req/s)")
    parser.add_argument("--num-prompts", type=int, default=64, help="requests per rate (default 64)")
    parser.add_argument("--goodput-ttft-ms", type=float, default=1000.0, help="goodput's TTFT SLO (default 1000)")
    parser.add_argument("--goodput-tpot-ms", type=float, default=150.0, help="goodput's TPOT SLO (default 150)")
    parser.add_argument("--goodput-attainment", type=float, default=0.9,
                        help="share of requests that must meet both SLOs (default 0.9)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parsed and checked flags; raises ConfigurationError naming the flag."""
    args = build_parser().parse_args(argv)
    check_server_arguments(args)
    if any(not rate > 0 for rate in args.request_rate):
        raise ConfigurationError("request-rate", f"every rate must be > 0, got {args.request_rate}")
    if args.num_prompts < 1:
        raise ConfigurationError("num-prompts", "must be >= 1")
    if not 0 < args.goodput_attainment <= 1:
        raise ConfigurationError("goodput-attainment", f"must be in (0, 1], got {args.goodput_attainment}")
    if args.goodput_ttft_ms <= 0 or args.goodput_tpot_ms <= 0:
        raise ConfigurationError("goodput-ttft-ms" if args.goodput_ttft_ms <= 0 else "goodput-tpot-ms", "must be > 0")
    return args


def goodput_slo(args: argparse.Namespace) -> GoodputSLO:
    return GoodputSLO(args.goodput_ttft_ms / 1000.0, args.goodput_tpot_ms / 1000.0, args.goodput_attainment)


def server_options(args: argparse.Namespace) -> ServerOptions:
    return ServerOptions(model=args.model, dtype=args.dtype, vllm_python=args.vllm_python,
                         vllm_memory_utilization=args.vllm_memory_utilization, vllm_args=tuple(args.vllm_args),
                         ready_timeout_s=args.ready_timeout)


def run_server(name: str, args: argparse.Namespace, workloads, options: ServerOptions,
               loads: list[LoadShape] | None = None, run_dir: Path | None = None,
               backend: str = "openai", label: str | None = None) -> list[RunResult]:
    """Start one server, run_loads against it, stop it. `run_dir` holds its logs; `label`
    (default: its name) starts each run's label."""
    started = time.perf_counter()
    with open_server(name, options, run_dir or args.out_dir / f"server-{name}") as base_url:
        logger.warning("%s ready at %s after %.1f s", name, base_url, time.perf_counter() - started)
        return run_loads(base_url, args, workloads, loads, backend, label or name)


def run_loads(base_url: str, args: argparse.Namespace, workloads, loads: list[LoadShape] | None = None,
              backend: str = "openai", label: str = "") -> list[RunResult]:
    """After the warm-up requests, each load (default: every --request-rate) on its prompt set
    through the OpenAI API at `base_url` (`backend`: openai or openai-chat), greedy, EOS ignored."""
    loads = loads or [LoadShape(rate, seed=args.seed) for rate in args.request_rate]
    warmup_prompts, prompt_sets = workloads
    model_id = asyncio.run(first_model_id(base_url))
    client = ClientOptions(backend, base_url, model=model_id, ignore_eos=True, temperature=0.0,
                           timeout_s=args.request_timeout)
    return asyncio.run(run_sweep(client, prompt_sets, loads, {}, label, warmup_prompts, PERCENTILES,
                                 show_progress=not args.disable_tqdm, on_run=_log_run))


def _log_run(run: RunResult) -> None:
    summary = run.summary
    logger.warning("%s: %.1f s, %d ok, %d failed, %.1f output tok/s, ITL p99 %.0f ms", run.label,
                   summary.duration_s, summary.num_completed, summary.num_failed, summary.output_throughput,
                   summary.itl.percentiles_ms["p99"])


def run_config(args: argparse.Namespace) -> dict:
    """What results.json records about the run besides the figures."""
    return {"workload": {"num_prompts": args.num_prompts, "input_len": args.input_len,
                         "output_len": args.output_len, "seed": args.seed, "request_rates": args.request_rate},
            "goodput_slo": vars(goodput_slo(args)),
            "servers": args.servers, "dtype": args.dtype, "vllm_python": str(args.vllm_python),
            "vllm_args": args.vllm_args, "num_cpus": os.cpu_count(), "load_average": os.getloadavg()}


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    args.out_dir = args.out_dir or Path(f"/tmp/pdserve-vs-vllm-{time.strftime('%Y%m%d-%H%M%S')}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    from services.bench.vocabulary import load_bench_tokenizer
    from benchmarks.machine import default_model_paths, print_machine

    print_machine(default_model_paths())

    spec = WorkloadSpec(num_prompts=args.num_prompts, input_len=LengthRange(*args.input_len),
                        output_len=LengthRange(args.output_len, args.output_len), seed=args.seed)
    workloads = sweep_workloads(spec, load_bench_tokenizer(args.model), len(args.request_rate), NUM_WARMUPS)
    options = server_options(args)
    series, broken = {}, []
    for name in args.servers:
        try:
            series[name] = run_server(name, args, workloads, options)
        except ServerStartError as error:  # the other servers still run and are reported
            logger.error("%s: %s", name, error)
            broken.append(name)
    if not series:
        raise SystemExit(f"no server started: {', '.join(broken)}")
    all_runs = [run for runs in series.values() for run in runs]
    write_result_json(args.out_dir / "results.json", run_config(args), all_runs)
    write_result_json(args.out_dir / "summary.json", run_config(args), all_runs, with_requests=False)
    (args.out_dir / "goodput.json").write_text(json.dumps(goodput_document(series, goodput_slo(args)), indent=1) + "\n")
    table = format_table(series, args.request_rate, goodput_slo(args))
    (args.out_dir / "table.md").write_text(table + "\n")
    print(table)
    print(f"\nresults in {args.out_dir}")
    if broken:
        print(f"did not start: {', '.join(broken)}")
    if broken or any(run.summary.num_failed for run in all_runs):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
