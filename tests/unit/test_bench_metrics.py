"""Benchmark metrics from hand-made records: exact TTFT, TPOT, ITL, percentiles, goodput."""

import math

import pytest

from services.bench.metrics import itls_s, parse_goodput, summarize, tpot_s
from services.bench.records import RequestRecord
from shared.errors import ConfigurationError


def record(index, prompt_len, times, num_tokens, end, error=None) -> RequestRecord:
    result = RequestRecord(index, prompt_len, expected_output_len=4)
    for elapsed, count in zip(times, num_tokens):
        result.add_chunk(elapsed, count)
    result.end_s = end
    result.error = error
    return result


# A: 4 tokens in messages of 1, 2, 1 (the 2-token message splits its 0.2 s gap in two).
FAST = record(0, 10, [0.1, 0.3, 0.4], [1, 2, 1], end=0.4)
# B: 2 tokens, TTFT 0.5 s, stream ends 0.1 s after the last token.
SLOW = record(1, 20, [0.5, 1.0], [1, 1], end=1.1)
FAILED = record(2, 30, [], [], end=0.2, error="UNAVAILABLE: no decode instance")


def test_per_request_tpot_and_itl():
    assert tpot_s(FAST) == pytest.approx(0.1)  # (0.4 - 0.1) / (4 - 1)
    assert itls_s(FAST) == pytest.approx([0.1, 0.1, 0.1])
    assert tpot_s(SLOW) == pytest.approx(0.6)  # (1.1 - 0.5) / (2 - 1)
    assert itls_s(SLOW) == pytest.approx([0.5])
    assert tpot_s(record(3, 5, [0.2], [1], end=0.2)) is None


def test_messages_without_tokens_are_not_recorded():
    result = record(0, 5, [0.1, 0.2], [0, 1], end=0.3)
    assert result.chunk_times_s == [0.2]
    assert result.num_output_tokens == 1


def test_reported_usage_wins_over_counted_tokens():
    result = record(0, 5, [0.1, 0.2], [1, 1], end=0.3)
    result.reported_output_len = 5
    assert result.num_output_tokens == 5
    assert tpot_s(result) == pytest.approx(0.05)  # (0.3 - 0.1) / 4


def test_summary_counts_throughputs_and_goodput():
    summary = summarize([FAST, SLOW, FAILED], duration_s=2.0, slos=parse_goodput(["ttft:200", "tpot:200"]))
    assert (summary.num_completed, summary.num_failed) == (2, 1)
    assert (summary.total_input_tokens, summary.total_output_tokens) == (30, 6)
    assert summary.request_throughput == pytest.approx(1.0)
    assert summary.output_throughput == pytest.approx(3.0)
    assert summary.total_token_throughput == pytest.approx(18.0)
    assert summary.request_goodput == pytest.approx(0.5)  # only FAST meets TTFT <= 200 ms
    assert summary.goodput_slos_ms == pytest.approx({"ttft": 200.0, "tpot": 200.0})
    assert summary.first_errors == ["UNAVAILABLE: no decode instance"]


def test_summary_means_and_percentiles_in_ms():
    summary = summarize([FAST, SLOW, FAILED], duration_s=2.0)
    assert summary.request_goodput is None
    assert summary.ttft.mean_ms == pytest.approx(300.0)
    assert summary.ttft.percentiles_ms == pytest.approx({"p50": 300.0, "p90": 460.0, "p99": 496.0})
    assert summary.itl.mean_ms == pytest.approx(200.0)  # gaps 100, 100, 100, 500
    assert summary.itl.percentiles_ms == pytest.approx({"p50": 100.0, "p90": 380.0, "p99": 488.0})
    assert summary.tpot.percentiles_ms["p50"] == pytest.approx(350.0)
    assert summary.e2el.mean_ms == pytest.approx(750.0)


def test_no_success_gives_nan_latencies():
    summary = summarize([FAILED], duration_s=1.0, percentiles=(50.0,))
    assert summary.num_completed == 0
    assert math.isnan(summary.ttft.mean_ms) and math.isnan(summary.itl.percentiles_ms["p50"])


def test_goodput_slos_parse_and_refuse_bad_input():
    assert parse_goodput(["ttft:1000", "tpot:100", "e2el:5000"]) == pytest.approx(
        {"ttft": 1.0, "tpot": 0.1, "e2el": 5.0})
    with pytest.raises(ConfigurationError, match="goodput: unknown metric 'itl'"):
        parse_goodput(["itl:50"])
    with pytest.raises(ConfigurationError, match="goodput: 'ttft' needs NAME:MILLISECONDS"):
        parse_goodput(["ttft"])
