"""Abort storm: clients that cancel their Generate call mid-transfer, many times, while other
streams run to completion (bench-faults' "abort storm" scenario, tests/e2e/test_abort_storm.py).

A cancel that lands while the prompt is computed or its KV is on the wire frees the request's
blocks and reservation; a transfer that then still arrives must be refused, not written into
blocks another request may already use. The aborts are timed three ways, in turn: a random
moment in the first half of a first token's usual wait (during StreamPrefill), one in its second
half (the KV send, between the prompt's end and the first token), and on the first token.

What is checked afterwards: the requests that completed are right (their greedy tokens equal an
offline fp32 reference), no block or reservation is left held once the load is over, and the
decode instances' refusals of late writes are counted (`pdserve:kv_transfer_late_writes_refused_total`).
"""

import random
import re
import statistics
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from benchmarks.fault_load import StreamResult, greedy_request, random_prompt

PHASES = ("during StreamPrefill", "during the KV send", "right after the first token")


@dataclass
class StormResult:
    num_aborts: int = 0
    by_phase: Counter = field(default_factory=Counter)  # aborts sent, by phase
    num_done_before_abort: int = 0  # requests that ended before their cancel landed
    errors: Counter = field(default_factory=Counter)  # other errors than CANCELLED, by code


def first_token_wait_s(stub, prompt_tokens: int, num_probes: int = 3, seed: int = 0) -> float:
    """Median seconds to a first token for prompts of `prompt_tokens` (the storm's time scale)."""
    waits = []
    for index in range(num_probes):
        started = time.monotonic()
        call = stub.Generate(greedy_request(random_prompt(prompt_tokens, seed * 100 + index), 2), timeout=600)
        next(iter(call))
        waits.append(time.monotonic() - started)
        call.cancel()
    return statistics.median(waits)


def abort_storm(stub, num_aborts: int, concurrency: int, prompt_tokens: int, max_tokens: int,
                first_token_s: float, seed: int) -> StormResult:
    """`num_aborts` Generate calls, `concurrency` at a time, each cancelled at its phase's moment."""
    result, lock = StormResult(), threading.Lock()
    rng = random.Random(seed)
    plans = [(index, PHASES[index % len(PHASES)], rng.random()) for index in range(num_aborts)]

    def one(plan) -> None:
        index, phase, fraction = plan
        request = greedy_request(random_prompt(prompt_tokens, seed * 100_000 + index), max_tokens)
        outcome = _aborted_call(stub, request, phase, fraction, first_token_s)
        with lock:
            result.num_aborts += 1
            result.by_phase[phase] += 1
            if outcome == "done":
                result.num_done_before_abort += 1
            elif outcome != "cancelled":
                result.errors[outcome] += 1

    with ThreadPoolExecutor(concurrency, thread_name_prefix="abort") as pool:
        list(pool.map(one, plans))
    return result


def _aborted_call(stub, request, phase: str, fraction: float, first_token_s: float) -> str:
    """'cancelled', 'done' (it finished first) or the error code's name."""
    call = stub.Generate(request, timeout=600)
    timer = None
    if phase != PHASES[2]:
        offset = 0.0 if phase == PHASES[0] else 0.5
        timer = threading.Timer((offset + 0.5 * fraction) * first_token_s, call.cancel)
        timer.start()
    try:
        for _ in call:
            if phase == PHASES[2]:
                call.cancel()
        return "done"
    except grpc.RpcError as error:
        return "cancelled" if error.code() == grpc.StatusCode.CANCELLED else error.code().name
    finally:
        if timer is not None:
            timer.cancel()


def wrong_outputs(completed: list[tuple[list[int], list[int]]], model: str, max_tokens: int) -> list[int]:
    """Indexes of (prompt, tokens) pairs whose greedy tokens differ from an offline fp32 run."""
    from shared.engine import LLM, SamplingParams

    with LLM(model=model, dtype="float32", num_threads=1) as llm:
        outputs = llm.generate([prompt for prompt, _ in completed],
                               SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    return [index for index, ((_, tokens), output) in enumerate(zip(completed, outputs))
            if list(output.token_ids) != tokens]


def completed_pairs(load, results: list[StreamResult]) -> list[tuple[list[int], list[int]]]:
    """(prompt, tokens) of every stream of a StreamingLoad that completed."""
    return [(load.prompt_of(r.index), list(r.token_ids)) for r in results if r.is_ok]


def late_writes_refused(metrics_addresses: list[str]) -> Counter:
    """The decode instances' refused late writes, by reason, summed."""
    found = Counter()
    for address in metrics_addresses:
        text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
        for reason, value in re.findall(
                r'^pdserve:kv_transfer_late_writes_refused_total\{[^}]*reason="(\w+)"[^}]*\} (\S+)', text, re.M):
            found[reason] += int(float(value))
    return found
