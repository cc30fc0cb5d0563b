"""Sends one workload at one request rate and measures it.

`run_benchmark` is called by sweep.run_sweep once per rate: it waits for each request's
arrival time (arrivals.arrival_offsets), caps in-flight requests at `max_concurrency` when
given, streams every request through the client, and summarizes the records.
"""

import asyncio
import time
from dataclasses import dataclass

from tqdm.asyncio import tqdm

from services.bench.arrivals import arrival_offsets
from services.bench.clients import BenchClient
from services.bench.datasets import BenchPrompt
from services.bench.metrics import DEFAULT_PERCENTILES, BenchSummary, summarize
from services.bench.records import RequestRecord


@dataclass(frozen=True)
class LoadShape:
    """How requests are offered: a mean rate (inf = all at once), burstiness, a concurrency cap."""

    request_rate: float
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0


@dataclass
class RunResult:
    """One run: its load, every request's record and the summary."""

    label: str
    load: LoadShape
    records: list[RequestRecord]
    summary: BenchSummary


async def run_benchmark(client: BenchClient, prompts: list[BenchPrompt], load: LoadShape,
                        slos: dict[str, float] | None = None, label: str = "",
                        percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
                        show_progress: bool = True) -> RunResult:
    offsets = arrival_offsets(len(prompts), load.request_rate, load.burstiness, load.seed)
    records = [RequestRecord(index, prompt.prompt_len, prompt.output_len) for index, prompt in enumerate(prompts)]
    limit = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
    progress = tqdm(total=len(prompts), desc=label or f"rate {load.request_rate:g}",
                    disable=not show_progress, leave=False)
    started = time.perf_counter()

    async def one(prompt: BenchPrompt, record: RequestRecord, offset: float) -> None:
        await asyncio.sleep(max(0.0, started + offset - time.perf_counter()))
        if limit is None:
            await _timed_send(client, prompt, record, started)
        else:
            async with limit:
                await _timed_send(client, prompt, record, started)
        progress.update(1)

    await asyncio.gather(*(one(p, r, o) for p, r, o in zip(prompts, records, offsets)))
    duration_s = time.perf_counter() - started
    progress.close()
    return RunResult(label, load, records, summarize(records, duration_s, slos, percentiles))


async def _timed_send(client: BenchClient, prompt: BenchPrompt, record: RequestRecord, started: float) -> None:
    record.start_s = time.perf_counter() - started
    await client.send(prompt, record)


async def warm_up(client: BenchClient, prompts: list[BenchPrompt], num_requests: int) -> list[RequestRecord]:
    """Send `num_requests` short requests (8 tokens) one after another before measuring."""
    records = []
    for index in range(num_requests):
        prompt = prompts[index % len(prompts)]
        record = RequestRecord(-1 - index, prompt.prompt_len, 8)
        await client.send(BenchPrompt(prompt.prompt_token_ids, 8, prompt.prompt_text), record)
        records.append(record)
    return records
