"""`make bench-autoscale`: the local stack under a load ramp, with `--autoscale` and with a
fixed 1 prefill + 1 decode. Every request must complete (scale-out and drain-on-scale-in
lose nothing); prints SLO attainment and instance-seconds, plots pool sizes, request rate,
TTFT and TPOT over time, and replays the same trace in the simulator for comparison.

    python -m benchmarks.autoscale --mode autoscale   # one configuration per heavy run
    python -m benchmarks.autoscale --mode fixed
    python -m benchmarks.autoscale --mode report      # table + plots from both JSONs
"""

import argparse
import asyncio
import json
import logging
import threading
import time
from pathlib import Path

from services.launcher.autoscale_runner import AutoscaleRunner
from services.launcher.config import StackConfig
from services.launcher.stack import LocalStack
from services.planner.config import PlannerConfig, PoolBounds
from services.bench.clients import ClientOptions, make_client
from services.bench.records import RequestRecord
from services.bench.vocabulary import load_bench_tokenizer, usable_token_ids

from benchmarks.autoscale_load import ramp_workload
from benchmarks.autoscale_report import write_report

logger = logging.getLogger("benchmarks.autoscale")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("autoscale", "fixed", "report"), required=True)
    parser.add_argument("--profile", type=Path, default=Path("docs/autoscaling/profile-smollm2-cpu-fp32.json"))
    parser.add_argument("--out", type=Path, default=Path("bench-results/autoscale"))
    parser.add_argument("--low", type=float, default=0.5)
    parser.add_argument("--high", type=float, default=4.0)
    parser.add_argument("--duration", type=float, default=180.0)
    parser.add_argument("--ttft-slo", type=float, default=3.0)
    parser.add_argument("--itl-slo", type=float, default=0.3)
    parser.add_argument("--max-prefill", type=int, default=2)
    parser.add_argument("--max-decode", type=int, default=2)
    return parser.parse_args()


def planner_config(args: argparse.Namespace) -> PlannerConfig:
    return PlannerConfig(ttft_slo_s=args.ttft_slo, itl_slo_s=args.itl_slo, prefill=PoolBounds(1, args.max_prefill),
                         decode=PoolBounds(1, args.max_decode), interval_s=5.0, scale_out_cooldown_s=10.0,
                         scale_in_cooldown_s=20.0, scale_in_patience=2, default_prompt_tokens=128,
                         default_output_tokens=48)


def sample_pools(stack: LocalStack, started: float, stop: threading.Event, into: list) -> None:
    """Every second: (t, prefill processes alive, decode processes alive, SERVING-and-routable)."""
    while not stop.wait(1.0):
        alive = [c for c in stack.instances if c.is_running()]
        into.append((time.perf_counter() - started, sum(c.role == "prefill" for c in alive),
                     sum(c.role == "decode" for c in alive)))


async def send_all(target: str, arrivals: list[float], prompts, started: float) -> list[RequestRecord]:
    client = make_client(ClientOptions("pdserve-grpc", target, timeout_s=900.0))
    records = [RequestRecord(i, p.prompt_len, p.output_len) for i, p in enumerate(prompts)]

    async def one(record: RequestRecord, prompt, offset: float) -> None:
        await asyncio.sleep(max(0.0, started + offset - time.perf_counter()))
        record.start_s = time.perf_counter() - started
        await client.send(prompt, record)

    await asyncio.gather(*(one(r, p, o) for r, p, o in zip(records, prompts, arrivals)))
    await client.close()
    return records


def run_mode(args: argparse.Namespace) -> dict:
    tokenizer = load_bench_tokenizer(None)
    arrivals, prompts, _ = ramp_workload(args.low, args.high, args.duration, (64, 192), (32, 64),
                                         usable_token_ids(tokenizer))
    config = StackConfig(num_prefill=1, num_decode=1, gateway_port=0, gateway_http_port=-1, num_threads=1,
                         stop_grace_s=150.0, extra_args={"instance": ["--shutdown-grace-s", "120"]})
    samples: list = []
    with LocalStack(config) as stack:
        stack.start()
        runner = AutoscaleRunner(stack, planner_config(args), args.profile, -1) if args.mode == "autoscale" else None
        stop, started = threading.Event(), time.perf_counter()
        sampler = threading.Thread(target=sample_pools, args=(stack, started, stop, samples), daemon=True)
        sampler.start()
        if runner is not None:
            runner.start()
        records = asyncio.run(send_all(stack.gateway_address, arrivals, prompts, started))
        stop.set()
        decisions = [json.loads(d.log_line()) for d in runner.service.decisions] if runner else []
        if runner is not None:
            runner.stop()
    return {"mode": args.mode, "args": {k: str(v) for k, v in vars(args).items()}, "pools": samples,
            "records": [r.__dict__ for r in records], "decisions": decisions}


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.mode != "report":
        from benchmarks.machine import default_model_paths, print_machine

        print_machine(default_model_paths())
        result = run_mode(args)
        (args.out / f"{args.mode}.json").write_text(json.dumps(result) + "\n")
        failed = [r for r in result["records"] if r["error"] or not r["chunk_times_s"]]
        print(f"{args.mode}: {len(result['records'])} requests, {len(failed)} failed")
    write_report(args.out, args.profile, args.ttft_slo, args.itl_slo)


if __name__ == "__main__":
    main()
