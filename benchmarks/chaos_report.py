"""The chaos benchmark's report: request outcomes, what the stack still held, outputs rescored
against the model, recovery per fault kind, and TTFT / ITL percentiles over time (table and plot).

Rescoring, in two passes. Every completed output is fed back to the model in float32 as one
prompt (prompt + output) and each output token is scored given the tokens before it (teacher
forcing); a token is flagged when fp32 rates the best token above it by more than NEAR_TIE_NATS.
The stack serves bf16, whose greedy choice differs from fp32's wherever the two models disagree,
and on these random-token prompts (whose outputs repeat a few tokens) they disagree by more than
half a nat about once in ten thousand tokens. So the flagged outputs are scored again in the
serving dtype, fault-free and alone: a flagged token is **wrong** only when the serving dtype too
rates its best token above it by more than NEAR_TIE_NATS. A KV block of another request, a stale
or half-written transfer, or a lost position makes tokens that neither model chooses; a token the
fault-free serving-dtype model itself chooses is counted as a "dtype disagreement", not an error.

The rule is RESCORING_RULE, with a version: a run writes it into results.json and the report's
header before the first request, so a "0 wrong" always names the rule it was counted under.
Version 1 (the 8-minute run of docs/chaos.md) was the fp32 pass alone; version 2 added the
serving-dtype confirmation. Changing the rule means a new version here.
"""
import math
from collections import Counter, defaultdict
from dataclasses import dataclass

from benchmarks.chaos_load import FAILED, LOST, OK, ChaosResult
from benchmarks.harness.fault_evidence import FaultEvidence
from benchmarks.harness.fault_evidence import summary as fault_evidence_summary


@dataclass(frozen=True)
class RescoringRule:
    version: int
    near_tie_nats: float
    text: str


RESCORING_RULE = RescoringRule(
    version=2, near_tie_nats=0.5,
    text="every completed output is scored in float32 with teacher forcing; a token is flagged when fp32 rates "
         "its best token more than 0.5 nats above it; flagged outputs are scored again in the serving dtype, "
         "alone and fault-free; a flagged token is wrong only when the serving dtype too rates its best token "
         "more than 0.5 nats above it, else it is a dtype disagreement (not an error)")
NEAR_TIE_NATS = RESCORING_RULE.near_tie_nats


def rescoring_rule_header() -> str:
    return (f"Rescoring rule v{RESCORING_RULE.version} (fixed before the run: RESCORING_RULE in "
            f"benchmarks/chaos_report.py): {RESCORING_RULE.text}.")


@dataclass
class FaultRecord:
    kind: str
    victim: str
    at_s: float  # since the load started
    held_s: float
    recovery_s: float  # from the heal until every instance is registered and both gateways answer
    notes: str = ""
    evidence: FaultEvidence | None = None  # what proved it took effect (None: never injected)

    @property
    def is_verified(self) -> bool:
        return self.evidence is not None and self.evidence.is_verified


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


@dataclass
class FlaggedToken:
    request: int
    position: int
    token_id: int
    best_id: int
    gap_nats: float

    def line(self, scorer: str, verb: str = "prefers") -> str:
        return (f"request {self.request}: output token {self.position} is {self.token_id}, {scorer} {verb} "
                f"{self.best_id} by {self.gap_nats:.2f} nats")


@dataclass
class Rescoring:
    num_scored: int
    wrong: list[FlaggedToken]  # flagged by fp32 and by the serving dtype: the first per output
    dtype_disagreements: list[FlaggedToken]  # flagged by fp32 only: the serving dtype chooses them too
    serving_dtype: str

    @property
    def wrong_lines(self) -> list[str]:
        return [flagged.line(f"fp32 and {self.serving_dtype}", "prefer") for flagged in self.wrong]


def rescore(results: list[ChaosResult], model: str, serving_dtype: str, batch: int = 16,
            flag_outputs=None) -> Rescoring:
    """fp32 flags, the serving dtype (scored alone, fault-free) confirms: see the module docstring.
    `flag_outputs(results, model, dtype, batch)`: the scoring pass (a fake in tests)."""
    flag_outputs = flag_outputs or _flag_outputs
    completed = [r for r in results if r.outcome(math.inf) == OK]
    flagged_fp32 = flag_outputs(completed, model, "float32", batch)
    suspects = [r for r in completed if flagged_fp32.get(r.index)]
    flagged_serving = flag_outputs(suspects, model, serving_dtype, 1) if serving_dtype != "float32" else flagged_fp32
    wrong, disagreements = [], []
    for result in suspects:
        confirmed = {f.position for f in flagged_serving.get(result.index, [])}
        for flagged in flagged_fp32[result.index]:
            (wrong if flagged.position in confirmed else disagreements).append(flagged)
    first_wrong = {}
    for flagged in wrong:
        first_wrong.setdefault(flagged.request, flagged)
    return Rescoring(len(completed), list(first_wrong.values()), disagreements, serving_dtype)


def _flag_outputs(results: list[ChaosResult], model: str, dtype: str, batch: int) -> dict[int, list[FlaggedToken]]:
    from shared.engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    flagged = {}
    with LLM(model=model, dtype=dtype, num_threads=1) as llm:
        for start in range(0, len(results), batch):
            chunk = results[start:start + batch]
            scored = llm.generate([r.prompt_ids + r.token_ids for r in chunk], params)
            for result, output in zip(chunk, scored):
                flagged[result.index] = flagged_tokens(result, output.prompt_logprobs)
    return flagged


def flagged_tokens(result: ChaosResult, prompt_logprobs) -> list[FlaggedToken]:
    """The output tokens the scoring model rates more than NEAR_TIE_NATS below its best token."""
    flagged = []
    for position, token_id in enumerate(result.token_ids):
        entry = prompt_logprobs[len(result.prompt_ids) + position - 1]
        best_id, best = entry.top[0]
        if best_id != token_id and best - entry.logprob > NEAR_TIE_NATS:
            flagged.append(FlaggedToken(result.index, position, token_id, best_id, best - entry.logprob))
    return flagged


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
    lines = ["| at s | fault | victim | held s | recovery s | verified | notes |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {f.at_s:.0f} | {f.kind} | {f.victim} | {f.held_s:.0f} | {f.recovery_s:.1f} | "
              f"{'yes' if f.is_verified else 'NO'} | {f.notes} |" for f in faults]
    return "\n".join(lines)


def all_evidence(faults: list[FaultRecord]) -> list[FaultEvidence]:
    """Each fault's evidence; a fault never injected has none: an empty one, not verified."""
    return [f.evidence or FaultEvidence(f.kind, f.victim) for f in faults]


def evidence_text(faults: list[FaultRecord]) -> str:
    """How many faults were verified, then each one's checks, one per line."""
    evidence = all_evidence(faults)
    lines = [line for found in evidence for line in found.lines()]
    return "\n".join([fault_evidence_summary(evidence), "", *(f"    {line}" for line in lines)])


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
        "| requests stranded | outputs rescored | wrong |",
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
