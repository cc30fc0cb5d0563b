"""The chaos benchmark's report: request outcomes, what the stack still held, outputs rescored
in fp32, recovery per fault kind, and TTFT / ITL percentiles over time (table and plot).

Rescoring: every completed output is fed back to the model in float32 as one prompt (prompt +
output) and each output token is scored given the tokens before it (teacher forcing). A token
is wrong when fp32 rates the best token above it by more than NEAR_TIE_NATS: the stack runs
bf16, whose greedy choice may differ from fp32's only where the two best tokens are nearly tied
(the criterion of tests/helpers/greedy_compare.py). A KV block of another request, a stale or
half-written transfer, or a lost position shows up as tokens fp32 rates far below its best.
"""

import math
from collections import Counter, defaultdict
from dataclasses import dataclass

from benchmarks.chaos_load import FAILED, LOST, OK, ChaosResult

NEAR_TIE_NATS = 0.5


@dataclass
class FaultRecord:
    kind: str
    victim: str
    at_s: float  # since the load started
    held_s: float
    recovery_s: float  # from the heal until every instance is registered and both gateways answer
    notes: str = ""


def outcomes(results: list[ChaosResult], timeout_s: float) -> Counter:
    return Counter(result.outcome(timeout_s) for result in results)


def failure_reasons(results: list[ChaosResult], timeout_s: float) -> Counter:
    """Failed and lost requests by status code and the message's first words (ids stripped)."""
    reasons = Counter()
    for result in results:
        outcome = result.outcome(timeout_s)
        if outcome != OK:
            words = " ".join(w for w in result.details.split()[:8] if not any(ch.isdigit() for ch in w))
            reasons[(outcome, result.code or "no status", words)] += 1
    return reasons


def rescore_fp32(results: list[ChaosResult], model: str, batch: int = 16) -> tuple[int, int, list[str]]:
    """(outputs scored, outputs with a wrong token, a line per wrong output)."""
    from shared.engine import LLM, SamplingParams

    completed = [r for r in results if r.outcome(math.inf) == OK]
    wrong_lines = []
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    with LLM(model=model, dtype="float32", num_threads=1) as llm:
        for start in range(0, len(completed), batch):
            chunk = completed[start:start + batch]
            scored = llm.generate([r.prompt_ids + r.token_ids for r in chunk], params)
            for result, output in zip(chunk, scored):
                line = _first_wrong_token(result, output.prompt_logprobs)
                if line:
                    wrong_lines.append(line)
    return len(completed), len(wrong_lines), wrong_lines


def _first_wrong_token(result: ChaosResult, prompt_logprobs) -> str:
    for position, token_id in enumerate(result.token_ids):
        entry = prompt_logprobs[len(result.prompt_ids) + position - 1]
        best_id, best = entry.top[0]
        if best_id != token_id and best - entry.logprob > NEAR_TIE_NATS:
            return (f"request {result.index}: output token {position} is {token_id}, fp32 prefers {best_id} by "
                    f"{best - entry.logprob:.2f} nats")
    return ""


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_windows(results: list[ChaosResult], started_at: float, window_s: float) -> list[dict]:
    """Per window of the run (by the time each first token / token arrived): TTFT and ITL p50/p99 (ms)."""
    ttfts, gaps = defaultdict(list), defaultdict(list)
    for result in results:
        if result.ttft_s is not None:
            ttfts[int((result.started_at + result.ttft_s - started_at) // window_s)].append(result.ttft_s)
        for at, gap in result.gaps:
            gaps[int((at - started_at) // window_s)].append(gap)
    windows = []
    for index in range(max([*ttfts, *gaps], default=-1) + 1):
        windows.append({"start_s": index * window_s, "num_first_tokens": len(ttfts[index]),
                        **{f"ttft_p{q}_ms": 1000 * percentile(ttfts[index], q / 100) for q in (50, 99)},
                        **{f"itl_p{q}_ms": 1000 * percentile(gaps[index], q / 100) for q in (50, 99)}})
    return windows


def recovery_table(faults: list[FaultRecord]) -> str:
    by_kind = defaultdict(list)
    for fault in faults:
        by_kind[fault.kind].append(fault.recovery_s)
    lines = ["| fault kind | injected | held s | recovery s: median | max |", "| --- | --- | --- | --- | --- |"]
    for kind, values in sorted(by_kind.items()):
        held = next(f.held_s for f in faults if f.kind == kind)
        known = [v for v in values if not math.isnan(v)]
        lines.append(f"| {kind} | {len(values)} | {held:.0f} | {percentile(known, 0.5):.1f} | "
                     f"{max(known, default=float('nan')):.1f}{'' if len(known) == len(values) else ' (some never)'} |")
    return "\n".join(lines)


def fault_log(faults: list[FaultRecord]) -> str:
    lines = ["| at s | fault | victim | held s | recovery s | notes |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {f.at_s:.0f} | {f.kind} | {f.victim} | {f.held_s:.0f} | {f.recovery_s:.1f} | {f.notes} |"
              for f in faults]
    return "\n".join(lines)


def latency_table(windows: list[dict]) -> str:
    lines = ["| window from s | first tokens | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {w['start_s']:.0f} | {w['num_first_tokens']} | {w['ttft_p50_ms']:.0f} | {w['ttft_p99_ms']:.0f} | "
              f"{w['itl_p50_ms']:.0f} | {w['itl_p99_ms']:.0f} |" for w in windows]
    return "\n".join(lines)


def summary_table(counts: Counter, leftovers, num_scored: int, num_wrong: int) -> str:
    sent = sum(counts.values())
    return "\n".join([
        "| sent | completed | failed with a clear error | lost | blocks stranded | reservations stranded "
        "| requests stranded | outputs rescored fp32 | wrong |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {sent} | {counts[OK]} | {counts[FAILED]} | {counts[LOST]} | {leftovers.held_blocks} | "
        f"{leftovers.reservations} | {leftovers.requests} | {num_scored} | {num_wrong} |"])


def plot_latency(windows: list[dict], faults: list[FaultRecord], path, title: str) -> None:
    """TTFT and ITL p50/p99 per window on a log scale, each fault a shaded span (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    starts = [w["start_s"] / 60 for w in windows]
    for axis, metric in ((top, "ttft"), (bottom, "itl")):
        for q, style in ((50, "-"), (99, "--")):
            axis.plot(starts, [w[f"{metric}_p{q}_ms"] for w in windows], style, drawstyle="steps-post",
                      label=f"{metric.upper()} p{q}")
        axis.set_yscale("log")
        axis.set_ylabel("ms")
        axis.legend(loc="upper left", fontsize=8)
        for fault in faults:
            axis.axvspan(fault.at_s / 60, (fault.at_s + fault.held_s + (0 if math.isnan(fault.recovery_s)
                                                                          else fault.recovery_s)) / 60,
                         color="tab:red", alpha=0.12)
    for fault in faults:
        top.annotate(fault.kind, (fault.at_s / 60, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                     fontsize=6, va="top", ha="right")
    bottom.set_xlabel("minutes since the load started (shaded: fault held, then recovery)")
    top.set_title(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
