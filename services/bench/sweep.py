"""One benchmark run per request rate against one server (`--request-rate 1 2 4 8`).

`run_sweep` is called by the bench command and by benchmarks/serve_compare.py (once per
stack). The client and its connections live for the whole sweep; short warm-up requests
precede the first run; runs go in the order given, each on its own prompt set
(workload.sweep_workloads), so no run hits the prefix cache another one filled.
"""

import logging
from collections.abc import Callable

from services.bench.clients import ClientOptions, make_client
from services.bench.datasets import BenchPrompt
from services.bench.metrics import DEFAULT_PERCENTILES
from services.bench.runner import LoadShape, RunResult, run_benchmark, warm_up

logger = logging.getLogger(__name__)


async def run_sweep(options: ClientOptions, prompt_sets: list[list[BenchPrompt]], loads: list[LoadShape],
                    slos: dict[str, float] | None = None, label: str = "",
                    warmup_prompts: list[BenchPrompt] | None = None,
                    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES, show_progress: bool = True,
                    on_run: Callable[[RunResult], None] | None = None) -> list[RunResult]:
    """Every load in turn; `on_run(result)` is called as each run finishes (e.g. to print it)."""
    client = make_client(options)
    runs = []
    try:
        warm = await warm_up(client, warmup_prompts or [], len(warmup_prompts or []))
        for record in warm:
            if record.error:
                logger.warning("warm-up request failed: %s", record.error)
        for load, prompts in zip(loads, prompt_sets, strict=True):
            run_label = f"{label} rate {load.request_rate:g}".strip()
            run = await run_benchmark(client, prompts, load, slos, run_label, percentiles, show_progress)
            runs.append(run)
            if on_run is not None:
                on_run(run)
    finally:
        await client.close()
    return runs
