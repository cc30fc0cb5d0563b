"""The served part of the multi-LoRA benchmark: output tok/s through an OpenAI HTTP API.

Two servers run side by side: one without LoRA ("base") and one serving every adapter
(pdserve: the local stack `make run` starts, gateway + prefill + decode, with
`--lora-modules` and `--max-loras` = the largest adapter count; vLLM: `vllm serve` with
`--enable-lora --lora-modules ...`). Each round sends, to each row's server in turn, one closed
loop of --num-requests streaming `/v1/completions` (the same random-token prompts, greedy, EOS
ignored) with at most --concurrency in flight, request i naming adapter i % count as its
`model`; a row's figure is its output tokens over the loop's wall time.
"""

import asyncio
import contextlib
import random
import time
from dataclasses import replace
from pathlib import Path

from services.bench.clients import ClientOptions, make_client
from services.bench.clients.openai_client import first_model_id
from services.bench.datasets import BenchPrompt
from services.bench.records import RequestRecord
from benchmarks.lora_workload import Adapter, configurations, spread
from benchmarks.serve_servers import ServerOptions, open_server


def random_prompts(num_prompts: int, prompt_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    generator = random.Random(seed)
    return [[generator.randrange(100, vocab_size - 100) for _ in range(prompt_len)] for _ in range(num_prompts)]


async def closed_loop(base_url: str, models: list[str], prompts: list[list[int]], output_len: int,
                      concurrency: int) -> float:
    """Output tok/s of every prompt sent with its model, `concurrency` in flight at most. Raises
    RuntimeError naming the first failed request."""
    clients = {model: make_client(ClientOptions("openai", base_url, model=model)) for model in set(models)}
    limit = asyncio.Semaphore(concurrency)
    records = [RequestRecord(index, len(prompt), output_len) for index, prompt in enumerate(prompts)]

    async def one(index: int) -> None:
        async with limit:
            await clients[models[index]].send(BenchPrompt(prompts[index], output_len), records[index])

    started = time.perf_counter()
    try:
        await asyncio.gather(*(one(index) for index in range(len(prompts))))
    finally:
        for client in clients.values():
            await client.close()
    elapsed = time.perf_counter() - started
    failed = [record for record in records if not record.is_success]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(records)} requests failed, the first: {failed[0].error}")
    return sum(record.num_output_tokens for record in records) / elapsed


async def wait_until_serving(base_url: str, model: str, timeout_s: float) -> None:
    """Send a one-token request until one succeeds (a stack answers /health before its gateway
    has seen an instance register). Raises RuntimeError with the last error after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await closed_loop(base_url, [model], [[100, 200, 300]], 1, 1)
            return
        except RuntimeError as error:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{base_url} did not serve {model} within {timeout_s:g} s: {error}") from None
        await asyncio.sleep(1.0)


def pdserve_lora_env(adapters: list[Adapter], max_loras: int, rank: int) -> dict[str, str]:
    """The settings (PDSERVE_* variables, read by the gateway and every instance) of a stack
    serving every adapter."""
    return {"PDSERVE_LORA_MODULES": ",".join(f"{adapter.name}={adapter.path}" for adapter in adapters),
            "PDSERVE_MAX_LORAS": str(max_loras), "PDSERVE_MAX_LORA_RANK": str(rank)}


def vllm_lora_args(adapters: list[Adapter], max_loras: int, rank: int) -> tuple[str, ...]:
    return ("--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(rank),
            "--lora-modules", *(f"{adapter.name}={adapter.path}" for adapter in adapters))


def run_served(server: str, options: ServerOptions, run_dir: Path, adapters: list[Adapter], counts: list[int],
               rank: int, prompts: list[list[int]], output_len: int, concurrency: int,
               rounds: int) -> dict[str, list[float]]:
    """`server` ("pdserve" or "vllm"): a base server and a LoRA server, rows interleaved per round."""
    max_loras = max(counts)
    if server == "vllm":
        lora_options = replace(options, vllm_args=options.vllm_args + vllm_lora_args(adapters, max_loras, rank))
    else:
        lora_options = replace(options, env={**options.env, **pdserve_lora_env(adapters, max_loras, rank)})
    rows = configurations(counts)
    rates: dict[str, list[float]] = {"base": []} | {label: [] for label, _ in rows}
    with contextlib.ExitStack() as stack:
        base_url = stack.enter_context(open_server(server, options, run_dir / f"{server}-base"))
        lora_url = stack.enter_context(open_server(server, lora_options, run_dir / f"{server}-lora"))
        base_model = asyncio.run(first_model_id(base_url))
        lora_base_model = asyncio.run(first_model_id(lora_url))
        for url, model in ((base_url, base_model), (lora_url, lora_base_model), (lora_url, adapters[0].name)):
            asyncio.run(wait_until_serving(url, model, options.ready_timeout_s))
        def models(num_requests: int, count: int) -> list[str]:
            return [lora_base_model if adapter is None else adapter.name
                    for adapter in spread(num_requests, adapters, count)]

        plans = [(label, models(len(prompts), count)) for label, count in rows]
        warm = [prompts[index % len(prompts)] for index in range(max(4, max_loras))]  # every adapter read once
        asyncio.run(closed_loop(base_url, [base_model] * len(warm), warm, 8, concurrency))
        for _, count in rows:
            asyncio.run(closed_loop(lora_url, models(len(warm), count), warm, 8, concurrency))
        for round_index in range(rounds):
            for label, url, models in [("base", base_url, [base_model] * len(prompts))] + [
                    (label, lora_url, models) for label, models in plans]:
                rates[label].append(asyncio.run(closed_loop(url, models, prompts, output_len, concurrency)))
                print(f"  round {round_index + 1}: {label}: {rates[label][-1]:.1f} output tok/s", flush=True)
    return rates
