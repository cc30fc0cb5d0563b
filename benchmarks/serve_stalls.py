"""Where decode stalls come from, read from a `make bench` (or `pdserve bench serve`) result JSON.

`python -m benchmarks.serve_stalls RESULTS.json [--threshold-ms 100]`: for every run, the
inter-token gaps longer than the threshold, how many of them contain another request's first
token (a prompt that reached the decoding engine during the gap: its prefill chunk in a
colocated step, or its KV landing on a disaggregated decode instance), and how many requests
were streaming at the time. Client-side timestamps only; no server instrumentation needed.
"""

import argparse
import bisect
import json
from pathlib import Path


def token_events(requests: list[dict]) -> tuple[list[tuple[float, float]], list[float]]:
    """(gap start, gap end) of every inter-token gap, and every request's first-token time,
    both in seconds from the run's start."""
    gaps, first_tokens = [], []
    for request in requests:
        if request["error"] is not None or not request["chunk_times_s"]:
            continue
        times = [request["start_s"] + t for t in request["chunk_times_s"]]
        first_tokens.append(times[0])
        gaps += list(zip(times, times[1:]))
    return gaps, sorted(first_tokens)


def stall_report(requests: list[dict], threshold_s: float) -> dict:
    gaps, first_tokens = token_events(requests)
    slow = [(start, end) for start, end in gaps if end - start > threshold_s]
    with_prompt = sum(bisect.bisect_right(first_tokens, end) > bisect.bisect_left(first_tokens, start)
                      for start, end in slow)
    return {"num_gaps": len(gaps), "num_slow_gaps": len(slow),
            "num_slow_gaps_with_a_new_prompt": with_prompt,
            "slow_gap_ms_mean": 1000 * sum(end - start for start, end in slow) / max(1, len(slow))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--threshold-ms", type=float, default=100.0)
    args = parser.parse_args()
    for run in json.loads(args.results.read_text())["runs"]:
        report = stall_report(run["requests"], args.threshold_ms / 1000)
        print(f"{run['label']:<28} gaps {report['num_gaps']:>6}  > {args.threshold_ms:g} ms: "
              f"{report['num_slow_gaps']:>5} (mean {report['slow_gap_ms_mean']:.0f} ms), "
              f"{report['num_slow_gaps_with_a_new_prompt']} of them span another request's first token")


if __name__ == "__main__":
    main()
