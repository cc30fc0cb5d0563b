"""What `pdserve bench serve` does once its flags are parsed (see bench_command.py)."""

import argparse
import asyncio
import dataclasses
import logging
import sys

from shared.errors import ConfigurationError

from services.bench.clients import ClientOptions
from services.bench.datasets import LengthRange
from services.bench.metrics import parse_goodput
from services.bench.report import format_summary, write_result_json
from services.bench.runner import LoadShape, RunResult
from services.bench.sweep import run_sweep
from services.bench.workload import WorkloadSpec, sweep_workloads

logger = logging.getLogger(__name__)


def workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(
        dataset=args.dataset_name, num_prompts=args.num_prompts,
        input_len=LengthRange.parse(args.random_input_len, "random-input-len"),
        output_len=LengthRange.parse(args.output_len, "random-output-len"),
        num_prefixes=args.shared_prefix_num_prefixes, prefix_len=args.shared_prefix_len,
        suffix_len=args.shared_prefix_suffix_len, dataset_path=args.dataset_path, seed=args.seed)


def client_options(args: argparse.Namespace) -> ClientOptions:
    """Where to send; an OpenAI target without --model gets the server's first model."""
    is_grpc = args.backend == "pdserve-grpc"
    target = args.gateway if is_grpc else args.base_url
    model = args.model
    if model is None and not is_grpc:
        from services.bench.clients.openai_client import first_model_id

        model = asyncio.run(first_model_id(target))
    return ClientOptions(args.backend, target, model or "", args.temperature, args.ignore_eos, args.timeout_s)


def loads_of(args: argparse.Namespace) -> list[LoadShape]:
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ConfigurationError("max-concurrency", f"must be >= 1, got {args.max_concurrency}")
    return [LoadShape(rate, args.burstiness, args.max_concurrency, args.seed) for rate in args.request_rate]


def run_bench_serve(args: argparse.Namespace) -> int:
    """Builds the workload, runs every rate, prints each summary; 1 if any request failed."""
    from services.bench.vocabulary import load_bench_tokenizer

    slos = parse_goodput(args.goodput)
    loads = loads_of(args)
    spec = workload_spec(args)
    warmup_prompts, prompt_sets = sweep_workloads(spec, load_bench_tokenizer(args.tokenizer), len(loads),
                                                  args.num_warmups, needs_text=args.backend == "openai-chat")
    options = client_options(args)

    def show(run: RunResult) -> None:
        print(format_summary(run.label or "benchmark", run.summary), flush=True)

    runs = asyncio.run(run_sweep(options, prompt_sets, loads, slos, args.label, warmup_prompts,
                                 tuple(args.percentiles), not args.disable_tqdm, on_run=show))
    if args.result_json:
        config = {"client": dataclasses.asdict(options), "workload": _plain(dataclasses.asdict(spec)),
                  "goodput_ms": {name: limit * 1000 for name, limit in slos.items()}}
        write_result_json(args.result_json, config, runs)
    if args.plot_dir:
        _write_plots(args, runs)
    failed = sum(run.summary.num_failed for run in runs)
    if failed:
        print(f"pdserve bench serve: {failed} request(s) failed", file=sys.stderr)
    return 1 if failed else 0


def _write_plots(args: argparse.Namespace, runs: list[RunResult]) -> None:
    from services.bench.plots import plot_latency_cdfs, plot_rate_sweep

    plot_latency_cdfs(runs, args.plot_dir / "latency_cdfs.png", args.label)
    if len(runs) > 1:
        plot_rate_sweep({args.label or args.backend: runs}, args.plot_dir / "rate_sweep.png", args.label)


def _plain(value):
    return {key: str(item) if hasattr(item, "__fspath__") else item for key, item in value.items()}
