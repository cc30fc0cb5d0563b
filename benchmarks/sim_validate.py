"""The simulator's validation against the real local stack: fixed 1 prefill + 1 decode
(1 thread each) under Poisson load at a few constant rates, one after the other on the same
stack after a few unrecorded warm-up requests; every request's TTFT and token times are
recorded, with each process's CPU seconds and the load average, so
`benchmarks.sim_validate_report` can replay the same requests in the simulator and compare
percentiles. Run it on a quiet machine: nothing else running.

    python -m benchmarks.sim_validate --rates 0.3 0.6 0.9 --duration 110 --out bench-results/sim-validate
"""

import argparse
import asyncio
import json
import logging
import os
import random
import resource
import statistics
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.autoscale import send_all
from services.bench.datasets import BenchPrompt
from benchmarks.harness.process_tree import descendants, parent_pids
from services.bench.vocabulary import load_bench_tokenizer, usable_token_ids
from services.launcher.config import StackConfig
from services.launcher.stack import LocalStack
from services.simulator.workload import poisson_arrivals

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=float, nargs="+", default=[0.3, 0.6, 0.9])
    parser.add_argument("--duration", type=float, default=110.0, help="seconds of arrivals per rate")
    parser.add_argument("--out", type=Path, default=Path("bench-results/sim-validate"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lone-requests", type=int, default=12,
                        help="requests sent one at a time before the rates, to measure the path's latency")
    parser.add_argument("--prompt-range", type=int, nargs=2, default=[32, 96], help="uniform prompt tokens")
    parser.add_argument("--output-range", type=int, nargs=2, default=[16, 48], help="uniform output tokens")
    return parser.parse_args()


def poisson_workload(rate: float, duration_s: float, token_ids: list[int], seed: int, args: argparse.Namespace):
    rng = random.Random(seed)
    arrivals = poisson_arrivals(rng, rate, duration_s)
    prompts = [BenchPrompt([rng.choice(token_ids) for _ in range(rng.randint(*args.prompt_range))],
                           rng.randint(*args.output_range)) for _ in arrivals]
    return arrivals, prompts


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int, parents: dict[int, int]) -> float:
    """CPU seconds of a service and every process it started (its engine-core child)."""
    return sum(cpu_seconds(member) for member in [pid, *descendants(pid, parents)])


def cpu_by_process(stack: LocalStack) -> dict[str, float]:
    parents = parent_pids()
    children = {child.name: tree_cpu_seconds(child.pid, parents) for child in stack.children() if child.pid}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children["load-generator"] = usage.ru_utime + usage.ru_stime
    return children


ENGINE_SERIES = ("vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count",
                 "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
                 "pdserve:engine_steps_total", "pdserve:prompt_tokens_computed_total")


def engine_series(stack: LocalStack) -> dict[str, dict[str, float]]:
    """Each instance's engine-side counters (queue time, engine TTFT, steps), summed over labels."""
    found = {}
    for name, info in stack.ready_info.items():
        if name == "gateway" or not info.get("metrics_address"):
            continue
        with urllib.request.urlopen(f"http://{info['metrics_address']}/metrics", timeout=10) as response:
            text = response.read().decode()
        values = dict.fromkeys(ENGINE_SERIES, 0.0)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in values:
                    values[sample.name] += sample.value
        found[name] = values
    return found


def series_delta(before: dict, after: dict) -> dict[str, dict[str, float]]:
    return {name: {key: value - before.get(name, {}).get(key, 0.0) for key, value in values.items()}
            for name, values in after.items()}


def run_rate(stack: LocalStack, rate: float, args: argparse.Namespace, token_ids: list[int]) -> dict:
    arrivals, prompts = poisson_workload(rate, args.duration, token_ids, args.seed + int(rate * 1000), args)
    series_before = engine_series(stack)
    cpu_before, load_before, started = cpu_by_process(stack), os.getloadavg()[0], time.perf_counter()
    records = asyncio.run(send_all(stack.gateway_address, arrivals, prompts, started))
    wall = time.perf_counter() - started
    cpu_after = cpu_by_process(stack)
    cores = {name: (cpu_after[name] - cpu_before.get(name, 0.0)) / wall for name in cpu_after}
    engines = series_delta(series_before, engine_series(stack))
    failed = sum(1 for r in records if r.error or not r.chunk_times_s)
    print(f"rate {rate}: {len(records)} requests, {failed} failed, {wall:.0f} s, cores used "
          + ", ".join(f"{k} {v:.2f}" for k, v in cores.items()), flush=True)
    for name, values in engines.items():
        print(f"  {name}: {describe_engine(values)}", flush=True)
    return {"rate": rate, "duration_s": args.duration, "wall_s": wall, "cores_used": cores,
            "load_average": [load_before, os.getloadavg()[0]], "engines": engines,
            "records": [r.__dict__ for r in records]}


def describe_engine(values: dict[str, float]) -> str:
    def mean(series: str) -> float:
        count = values[f"{series}_count"]
        return values[f"{series}_sum"] / count if count else 0.0
    return (f"engine queue mean {mean('vllm:request_queue_time_seconds'):.3f} s, engine TTFT mean "
            f"{mean('vllm:time_to_first_token_seconds'):.3f} s, {values['pdserve:engine_steps_total']:.0f} steps, "
            f"{values['pdserve:prompt_tokens_computed_total']:.0f} prompt tokens computed")


def lone_requests(stack: LocalStack, args: argparse.Namespace, token_ids: list[int]) -> list[dict]:
    """Requests sent one at a time (each after the last finished) on the idle stack: their TTFT
    minus the profiled prefill and transfer is the request path's own latency, which the report
    measures here, apart from the loaded runs it then predicts."""
    rng = random.Random(args.seed - 2)
    records = []
    for _ in range(args.lone_requests):
        prompt = BenchPrompt([rng.choice(token_ids) for _ in range(rng.randint(*args.prompt_range))], 4)
        records += asyncio.run(send_all(stack.gateway_address, [0.0], [prompt], time.perf_counter()))
    return [r.__dict__ for r in records if not r.error and r.chunk_times_s]


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    from benchmarks.machine import default_model_paths, print_machine

    print_machine(default_model_paths())

    token_ids = usable_token_ids(load_bench_tokenizer(None))
    config = StackConfig(num_prefill=1, num_decode=1, gateway_port=0, gateway_http_port=-1, num_threads=1)
    results = []
    with LocalStack(config) as stack:
        stack.start()
        warm_arrivals, warm_prompts = poisson_workload(1.0, 8.0, token_ids, args.seed - 1, args)  # not recorded
        asyncio.run(send_all(stack.gateway_address, warm_arrivals, warm_prompts, time.perf_counter()))
        lone = lone_requests(stack, args, token_ids)
        print(f"lone requests: TTFT median {statistics.median(r['chunk_times_s'][0] for r in lone):.3f} s", flush=True)
        for rate in args.rates:
            results.append(run_rate(stack, rate, args, token_ids))
            (args.out / "runs.json").write_text(json.dumps({"host_cores": len(os.sched_getaffinity(0)),
                                                            "lone": lone, "runs": results}) + "\n")


if __name__ == "__main__":
    main()
