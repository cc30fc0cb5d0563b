"""Soak benchmark (`make bench-soak`): the local stack (1 prefill + 1 decode) under an
operator's steady mixed load for N minutes, watching memory and latency.

Starts Redis, one prefill and one decode instance and a gateway (services.launcher, every
listener on an ephemeral loopback port), then sends the mix of benchmarks.harness.soak_load
(plain, long, n=2 with logprobs=5, cancelled mid-stream, guided_json with distinct schemas)
over the OpenAI HTTP API at Poisson `--rate` for `--minutes` (SOAK_MINUTES, default 30),
sampling every process's RSS and the instances' `pdserve:memory_bytes{component}`. Prints
each process's RSS growth per minute after the warm-up and TTFT/ITL percentiles per interval,
and writes soak.md, samples.json, rss.png and latency.png into --out-dir.
"""

import argparse
import asyncio
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from services.launcher import LocalStack, StackConfig  # noqa: E402
from benchmarks.harness.soak_load import SoakLoad, SoakMix  # noqa: E402
from benchmarks.harness.soak_plots import plot_latency, plot_rss  # noqa: E402
from benchmarks.harness.soak_report import growth_table, interval_latencies, latency_table, rss_growth  # noqa: E402
from benchmarks.harness.soak_samples import MemorySampler  # noqa: E402
from services.bench.vocabulary import load_bench_tokenizer, usable_token_ids  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments  # noqa: E402

logger = logging.getLogger("soak")
TARGET_MIB_PER_MINUTE = 5.0
IDLE_TAIL_S = 30.0  # the stack keeps being sampled this long after the load stops


def stack_config(args: argparse.Namespace, run_dir: Path) -> StackConfig:
    return StackConfig(num_prefill=1, num_decode=1, model=args.model, num_threads=1, gateway_port=0,
                       gateway_http_port=0, run_dir=run_dir, ready_timeout_s=300.0,
                       extra_args={"instance": args.instance_args.split()} if args.instance_args else {},
                       env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})


def watched_processes(stack: LocalStack) -> tuple[dict[str, int], dict[str, str]]:
    """(pid by process name, /metrics URL by instance name) of the stack's services."""
    children = [*stack.instances, stack.gateway]
    pids = {child.name: child.pid for child in children}
    urls = {name: f"http://{info['metrics_address']}/metrics" for name, info in stack.ready_info.items()
            if info.get("metrics_address") and name != "gateway"}
    return pids, urls


async def soak(stack: LocalStack, args: argparse.Namespace) -> tuple[SoakLoad, MemorySampler]:
    pids, urls = watched_processes(stack)
    base_url = f"http://{stack.ready_info['gateway']['http_address']}"
    token_ids = usable_token_ids(load_bench_tokenizer(args.model))
    model = json.loads((await asyncio.to_thread(_get, f"{base_url}/v1/models")))["data"][0]["id"]
    load = SoakLoad(base_url, model, token_ids, SoakMix(), args.rate, args.seed)
    sampler = MemorySampler(pids, urls, args.sample_s)
    duration_s = args.minutes * 60
    await asyncio.gather(load.run(duration_s), sampler.run(duration_s + IDLE_TAIL_S))
    return load, sampler


def _get(url: str) -> str:
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def write_report(load: SoakLoad, sampler: MemorySampler, args: argparse.Namespace) -> str:
    warmup_s = args.warmup_minutes * 60
    growth = rss_growth([s for s in sampler.samples if s.elapsed_s <= args.minutes * 60], warmup_s)
    latencies = interval_latencies(load.records, args.interval_s)
    num_errors = sum(not r.is_success and r.kind != "cancelled" for r in load.records)
    text = (f"Soak: {args.minutes:g} min at {args.rate:g} req/s, {len(load.records)} requests "
            f"({num_errors} failed), warm-up {args.warmup_minutes:g} min, RSS sampled every {args.sample_s:g} s.\n\n"
            f"{growth_table(growth, TARGET_MIB_PER_MINUTE)}\n\n{latency_table(latencies)}\n")
    out = args.out_dir
    (out / "soak.md").write_text(text)
    (out / "samples.json").write_text(json.dumps([asdict(s) for s in sampler.samples]))
    plot_rss(sampler.samples, warmup_s, out / "rss.png", f"RSS, {args.minutes:g}-minute soak at {args.rate:g} req/s")
    plot_latency(latencies, out / "latency.png")
    return text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 30)))
    parser.add_argument("--warmup-minutes", type=float, default=2.0)
    parser.add_argument("--rate", type=float, default=0.74, help="requests per second (Poisson)")
    parser.add_argument("--interval-s", type=float, default=60.0, help="latency table interval")
    parser.add_argument("--sample-s", type=float, default=10.0, help="RSS sampling period")
    add_engine_arguments(parser, "model")
    parser.add_argument("--instance-args", default="", help="extra flags for both instances")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=Path("bench-results/soak"))
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from benchmarks.machine import default_model_paths, print_machine

    print_machine(default_model_paths())

    args.out_dir.mkdir(parents=True, exist_ok=True)
    with LocalStack(stack_config(args, args.out_dir / "stack")) as stack:
        started = time.perf_counter()
        stack.start()
        logger.warning("stack SERVING after %.1f s; logs in %s", time.perf_counter() - started, stack.run_dir / "logs")
        load, sampler = asyncio.run(soak(stack, args))
    print(write_report(load, sampler, args))
    print(f"plots and samples in {args.out_dir}")


if __name__ == "__main__":
    main()
