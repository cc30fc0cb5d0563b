"""Multi-turn chats against pdserve with and without its KV tiers, and `vllm serve` with prefix
caching (`make bench-multiturn`).

`python -m benchmarks.multiturn [--servers ...] [--vllm-python VENV/bin/python] [flags]`: for
each server in turn (benchmarks/multiturn_servers.py) it starts the server, runs the workload
(benchmarks/multiturn_workload.py: --num-chats conversations of --num-turns turns over one
shared system prompt, each turn a new user message after the previous answer, round-robin,
--concurrency at a time, greedy answers of exactly --output-tokens tokens through
`/v1/chat/completions`) and stops it. Pools of --pool-gb each are meant to be outgrown by the
conversations (the run says whether they are), so that eviction happens. It prints TTFT
p50/p99 per turn index and server, where the prompt tokens' KV came from (pool, host tier,
file tier, peer, computed), and the issue's targets; writes results.json, table.md and
ttft_by_turn.png into --out-dir.
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

import httpx2  # noqa: E402

from benchmarks.multiturn_client import TurnResult, send_turn  # noqa: E402
from benchmarks.multiturn_report import plot_ttft_by_turn, source_table, targets, ttft_table  # noqa: E402
from benchmarks.multiturn_servers import (SERVERS, MultiturnServerOptions, RunningServer, cache_counters,  # noqa: E402
                                          open_server)
from benchmarks.multiturn_workload import ChatTexts, ChatWorkload, build_texts, history_tokens, round_robin  # noqa: E402
from benchmarks.serve_servers import ServerOptions, ServerStartError  # noqa: E402
from benchmarks.engine_flags import add_engine_arguments  # noqa: E402

logger = logging.getLogger("benchmarks.multiturn")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = ChatWorkload()
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--vllm-python", type=Path, default=os.environ.get("PDSERVE_VLLM_PYTHON") or None)
    parser.add_argument("--num-chats", type=int, default=defaults.num_chats)
    parser.add_argument("--num-turns", type=int, default=defaults.num_turns)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--system-tokens", type=int, default=defaults.system_tokens)
    parser.add_argument("--user-tokens", type=int, default=defaults.user_tokens)
    parser.add_argument("--output-tokens", type=int, default=defaults.output_tokens)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pool-gb", type=float, default=1.0, help="KV pool per pdserve instance and vLLM's KV space")
    parser.add_argument("--host-tier-gb", type=float, default=-1.0, help="pdserve-tiers' host tier (-1: machine-sized)")
    parser.add_argument("--file-tier-gb", type=float, default=0.0, help="pdserve-tiers' file tier (0: off)")
    add_engine_arguments(parser, "dtype", "model")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--out-dir", type=Path, default=None)
    return parser


def workload_of(args: argparse.Namespace) -> ChatWorkload:
    return ChatWorkload(args.num_chats, args.num_turns, args.concurrency, args.system_tokens, args.user_tokens,
                        args.output_tokens, args.seed)


async def run_workload(server: RunningServer, workload: ChatWorkload, texts: ChatTexts) -> list[TurnResult]:
    """Every turn, round-robin, `concurrency` at a time; a chat's turn waits for its previous one."""
    conversations = [[{"role": "system", "content": texts.system}] for _ in range(workload.num_chats)]
    answered = [asyncio.Event() for _ in range(workload.num_chats * (workload.num_turns + 1))]
    for chat in range(workload.num_chats):
        answered[chat * (workload.num_turns + 1)].set()  # "turn 0" of every chat
    queue = list(round_robin(workload))
    results: list[TurnResult] = []
    started = time.perf_counter()
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx2.AsyncClient(timeout=1800.0, limits=limits) as http:
        model = (await http.get(f"{server.base_url}/v1/models")).json()["data"][0]["id"]

        async def worker() -> None:
            while queue:
                turn = queue.pop(0)
                slot = turn.chat * (workload.num_turns + 1)
                await answered[slot + turn.index - 1].wait()
                messages = conversations[turn.chat] + [{"role": "user",
                                                        "content": texts.user_messages[turn.chat][turn.index - 1]}]
                result = TurnResult(turn.chat, turn.index, time.perf_counter() - started)
                await send_turn(http, server.base_url, model, messages, workload.output_tokens, result)
                results.append(result)
                conversations[turn.chat] = messages + [{"role": "assistant", "content": result.answer}]
                answered[slot + turn.index].set()

        await asyncio.gather(*(worker() for _ in range(workload.concurrency)))
    return results


def run_server(name: str, args: argparse.Namespace, workload: ChatWorkload, texts: ChatTexts,
               options: MultiturnServerOptions) -> tuple[list[TurnResult], dict[str, float]]:
    with open_server(name, options, args.out_dir / f"server-{name}") as server:
        before = cache_counters(server)
        results = asyncio.run(run_workload(server, workload, texts))
        after = cache_counters(server)
    failed = [r for r in results if not r.is_ok]
    logger.warning("%s: %d turns, %d failed%s", name, len(results), len(failed),
                   f" (first: {failed[0].error})" if failed else "")
    return results, {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}


def report(args, workload: ChatWorkload, series, caches) -> str:
    pool_tokens = MultiturnServerOptions(None, args.pool_gb, 0).pool_tokens if args.dtype == "bfloat16" else None
    lines = [f"{workload.num_chats} chats x {workload.num_turns} turns, system {workload.system_tokens}, user "
             f"{workload.user_tokens}, answers {workload.output_tokens} tokens, {workload.concurrency} at a time; "
             f"histories ~{history_tokens(workload)} tokens"
             + (f" vs ~{pool_tokens} tokens per {args.pool_gb:g} GiB pool" if pool_tokens else ""),
             f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs", "",
             "TTFT by turn index", ttft_table(series), "",
             "Where the prompt tokens' KV came from (pdserve: its prefill instances)", source_table(caches, series), ""]
    return "\n".join(lines + targets(series))


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    if "vllm" in args.servers and args.vllm_python is None:
        raise SystemExit("--servers includes vllm: give --vllm-python (or PDSERVE_VLLM_PYTHON)")
    args.out_dir = args.out_dir or Path(f"/tmp/pdserve-multiturn-{time.strftime('%Y%m%d-%H%M%S')}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    from services.bench.vocabulary import load_bench_tokenizer
    from benchmarks.machine import default_model_paths, print_machine

    print_machine(default_model_paths(args.dtype))
    workload = workload_of(args)
    texts = build_texts(workload, load_bench_tokenizer(args.model))
    options = MultiturnServerOptions(
        ServerOptions(model=args.model, dtype=args.dtype, vllm_python=args.vllm_python,
                      ready_timeout_s=args.ready_timeout), args.pool_gb, args.host_tier_gb, args.file_tier_gb)
    series, caches, broken = {}, {}, []
    for name in args.servers:
        try:
            series[name], caches[name] = run_server(name, args, workload, texts, options)
        except ServerStartError as error:
            logger.error("%s: %s", name, error)
            broken.append(name)
    table = report(args, workload, series, caches)
    (args.out_dir / "table.md").write_text(table + "\n")
    (args.out_dir / "results.json").write_text(json.dumps(
        {"workload": asdict(workload), "args": {k: str(v) for k, v in vars(args).items()}, "caches": caches,
         "turns": {name: [asdict(r) | {"answer": None} for r in results] for name, results in series.items()}},
        indent=1))
    if series:
        plot_ttft_by_turn(series, args.out_dir / "ttft_by_turn.png")
    print(table)
    print(f"\nresults in {args.out_dir}")
    if broken or any(not r.is_ok for results in series.values() for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
