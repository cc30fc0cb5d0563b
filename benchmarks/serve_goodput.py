"""Goodput, the P/D metric (DistServe): the highest request rate at which at least a share of the
requests (default 90%) meet both latency SLOs (default TTFT <= 1 s and TPOT <= 150 ms, issue 36's:
100 ms is about one decode step of a loaded 2-core CPU, where goodput resolved only to 0, 1 or 2).

`python -m benchmarks.serve_vs_vllm` sweeps request rates per server; this module turns each
server's runs into its SLO attainment per rate and its goodput, and compares pdserve's with
vLLM's (issue 23's target: at least 1.3x). A failed request counts as one that missed its
SLOs. Goodput is the highest swept rate that meets the attainment, so it is only as fine as the
sweep; a lower rate that misses while a higher one meets is reported, not hidden.
"""

from dataclasses import dataclass

from services.bench.metrics import tpot_s, ttft_s
from services.bench.runner import RunResult

BASELINE = "vllm"
GOODPUT_RATIO_TARGET = 1.3


@dataclass(frozen=True)
class GoodputSLO:
    ttft_s: float = 1.0
    tpot_s: float = 0.15
    attainment: float = 0.9

    def describe(self) -> str:
        return (f">= {self.attainment:.0%} of requests with TTFT <= {self.ttft_s * 1000:g} ms and "
                f"TPOT <= {self.tpot_s * 1000:g} ms")


def attainment(run: RunResult, slo: GoodputSLO) -> float:
    """The share of the run's requests that completed within both SLOs."""
    if not run.records:
        return 0.0
    good = sum(record.is_success and ttft_s(record) <= slo.ttft_s and (tpot_s(record) or 0.0) <= slo.tpot_s
               for record in run.records)
    return good / len(run.records)


def goodput(runs: list[RunResult], slo: GoodputSLO) -> float:
    """The highest offered rate whose run meets the attainment (0 when none does)."""
    return max((run.load.request_rate for run in runs if attainment(run, slo) >= slo.attainment), default=0.0)


def goodput_document(series: dict[str, list[RunResult]], slo: GoodputSLO) -> dict:
    """What goodput.json holds: the SLOs, then per server its goodput and attainment per rate."""
    return {"slo": {"ttft_ms": slo.ttft_s * 1000, "tpot_ms": slo.tpot_s * 1000, "attainment": slo.attainment},
            "servers": {server: {"goodput_req_s": goodput(runs, slo),
                                 "attainment_by_rate": {f"{run.load.request_rate:g}": attainment(run, slo)
                                                        for run in runs}}
                        for server, runs in series.items()}}


def goodput_lines(series: dict[str, list[RunResult]], slo: GoodputSLO) -> list[str]:
    """Per server: attainment at each rate and its goodput; then each pdserve server against vLLM."""
    lines = [f"goodput ({slo.describe()}):"]
    figures = {}
    for server, runs in series.items():
        figures[server] = goodput(runs, slo)
        shares = ", ".join(f"{run.load.request_rate:g}: {attainment(run, slo):.0%}" for run in runs)
        misses_below = [run.load.request_rate for run in runs
                        if run.load.request_rate < figures[server] and attainment(run, slo) < slo.attainment]
        note = f" (but missed at {', '.join(f'{rate:g}' for rate in misses_below)} req/s)" if misses_below else ""
        lines.append(f"- {server}: goodput {figures[server]:g} req/s{note}; attainment per rate {shares}")
    if BASELINE in figures:
        for server, value in figures.items():
            if server == BASELINE:
                continue
            if figures[BASELINE] > 0:
                times = value / figures[BASELINE]
                verdict = "met" if times >= GOODPUT_RATIO_TARGET else "not met"
                lines.append(f"- {server} / vLLM goodput: {times:.2f}x (target >= {GOODPUT_RATIO_TARGET}x: {verdict})")
            else:
                lines.append(f"- {server} / vLLM goodput: vLLM met the SLOs at no swept rate")
    return lines
