"""Tables and a plot of `make bench-multiturn`: TTFT p50/p99 per turn index and server, where
each server's prompt tokens came from (pool, host tier, file tier, peer, computed), and the
issue's targets (turns 2+: p50 at most 0.4x the stack without tiers; p99 no worse than vLLM)."""

from pathlib import Path

import numpy as np

from benchmarks.multiturn_client import TurnResult
from benchmarks.multiturn_servers import TIERS

P50_TARGET = 0.4


def percentile_ms(values_s: list[float], q: float) -> float:
    return float(np.percentile(values_s, q)) * 1e3 if values_s else float("nan")


def ttfts_by_turn(results: list[TurnResult]) -> dict[int, list[float]]:
    found: dict[int, list[float]] = {}
    for result in results:
        if result.is_ok:
            found.setdefault(result.turn, []).append(result.ttft_s)
    return dict(sorted(found.items()))


def later_turns(results: list[TurnResult]) -> list[float]:
    return [r.ttft_s for r in results if r.is_ok and r.turn >= 2]


def ttft_table(series: dict[str, list[TurnResult]]) -> str:
    names = list(series)
    header = "| turn | " + " | ".join(f"{name} p50 ms | {name} p99 ms" for name in names) + " |"
    lines = [header, "|" + " --- |" * (1 + 2 * len(names))]
    turns = sorted({turn for results in series.values() for turn in ttfts_by_turn(results)})
    rows = [(str(turn), {name: ttfts_by_turn(results).get(turn, []) for name, results in series.items()})
            for turn in turns]
    rows.append(("2+", {name: later_turns(results) for name, results in series.items()}))
    for label, values in rows:
        cells = [f"{percentile_ms(values[name], 50):.0f} | {percentile_ms(values[name], 99):.0f}" for name in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def source_table(caches: dict[str, dict[str, float]], series: dict[str, list[TurnResult]]) -> str:
    """Shares of the prompt tokens the (prefill) engines looked up, by where their KV came from."""
    lines = ["| server | prompt tokens | pool | " + " | ".join(TIERS) + " | computed | cached per usage |",
             "|" + " --- |" * (5 + len(TIERS))]
    for name, counters in caches.items():
        queries = counters.get("queries", 0.0)
        tier_tokens = {tier: counters.get(f"{tier}_tokens", 0.0) for tier in TIERS}
        pool = counters.get("hits", 0.0) - sum(tier_tokens.values())
        computed = queries - counters.get("hits", 0.0)

        def share(tokens: float) -> str:
            return f"{tokens / queries:.1%}" if queries else "-"
        lines.append(f"| {name} | {queries:.0f} | {share(pool)} | " + " | ".join(share(tier_tokens[t]) for t in TIERS)
                     + f" | {share(computed)} | {_usage_share(series.get(name, []))} |")
    return "\n".join(lines)


def _usage_share(results: list[TurnResult]) -> str:
    """Cached prompt tokens over prompt tokens, as the API's usage reported them."""
    reported = [r for r in results if r.is_ok and r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in reported)
    return f"{sum(r.cached_tokens for r in reported) / prompt:.1%}" if prompt else "-"


def targets(series: dict[str, list[TurnResult]]) -> list[str]:
    lines = []
    tiers, plain, vllm = series.get("pdserve-tiers"), series.get("pdserve-no-tiers"), series.get("vllm")
    if tiers and plain:
        for turn, values in ttfts_by_turn(tiers).items():
            if turn >= 2 and ttfts_by_turn(plain).get(turn):
                ratio = percentile_ms(values, 50) / percentile_ms(ttfts_by_turn(plain)[turn], 50)
                verdict = "met" if ratio <= P50_TARGET else "missed"
                lines.append(f"turn {turn}: TTFT p50 tiers / no tiers = {ratio:.2f} (target <= {P50_TARGET}: {verdict})")
    if tiers and vllm and later_turns(vllm):
        ratio = percentile_ms(later_turns(tiers), 99) / percentile_ms(later_turns(vllm), 99)
        lines.append(f"turns 2+: TTFT p99 pdserve-tiers / vllm = {ratio:.2f} (target <= 1: "
                     f"{'met' if ratio <= 1 else 'missed'})")
    return lines


def plot_ttft_by_turn(series: dict[str, list[TurnResult]], path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, q in zip(axes, (50, 99)):
        for name, results in series.items():
            by_turn = ttfts_by_turn(results)
            axis.plot(list(by_turn), [percentile_ms(v, q) for v in by_turn.values()], marker="o", label=name)
        axis.set(title=f"TTFT p{q} by turn", xlabel="turn", ylabel="ms")
        axis.set_xticks(sorted({turn for results in series.values() for turn in ttfts_by_turn(results)}))
        axis.set_yscale("log")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
