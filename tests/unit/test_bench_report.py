"""Benchmark output: the printed summary, the result JSON, the PNG plots, the compare table,
and the `pdserve bench serve` flags."""

import json
import math

import pytest

from benchmarks.serve_compare_table import format_compare_table
from services.bench.datasets import LengthRange
from services.bench.metrics import parse_goodput, summarize
from services.bench.plots import plot_latency_cdfs, plot_rate_sweep
from services.bench.records import RequestRecord
from services.bench.report import format_summary, write_result_json
from services.bench.runner import LoadShape, RunResult
from services.cli.bench_run import loads_of, workload_spec
from services.cli.main import build_parser

PNG_MAGIC = b"\x89PNG"


def fake_run(label: str, rate: float, gap_s: float) -> RunResult:
    """Two requests of 3 tokens each, `gap_s` apart, TTFT 0.1 s."""
    records = []
    for index in range(2):
        record = RequestRecord(index, prompt_len=8, expected_output_len=3)
        for position in range(3):
            record.add_chunk(0.1 + position * gap_s, 1)
        record.end_s = 0.1 + 2 * gap_s
        records.append(record)
    summary = summarize(records, duration_s=1.0, slos=parse_goodput(["ttft:500"]))
    return RunResult(label, LoadShape(rate), records, summary)


def test_summary_text_names_every_figure():
    text = format_summary("colocated rate 4", fake_run("c", 4, 0.05).summary)
    assert "Successful requests:" + " " * 20 + "2" in text
    assert "Request goodput (ttft<=500ms):" in text
    for name in ("Time to first token", "Inter-token latency", "End-to-end latency", "p99 (ms):"):
        assert name in text


def test_result_json_has_config_summary_and_every_request(tmp_path):
    path = tmp_path / "out" / "result.json"
    write_result_json(path, {"rate": math.inf}, [fake_run("c", math.inf, 0.05)])
    document = json.loads(path.read_text())
    assert document["config"] == {"rate": "inf"}
    [run] = document["runs"]
    assert run["load"]["request_rate"] == "inf"
    assert run["summary"]["num_completed"] == 2
    assert run["summary"]["itl"]["percentiles_ms"]["p50"] == pytest.approx(50.0)
    assert run["requests"][1]["chunk_times_s"] == pytest.approx([0.1, 0.15, 0.2])


def test_plots_are_png_files(tmp_path):
    colocated = [fake_run("colocated", rate, 0.05) for rate in (1, 2)]
    disaggregated = [fake_run("disaggregated", rate, 0.02) for rate in (1, 2)]
    cdfs = plot_latency_cdfs([colocated[0], disaggregated[0]], tmp_path / "cdfs.png", "at 1 req/s")
    sweep = plot_rate_sweep({"colocated": colocated, "disaggregated": disaggregated}, tmp_path / "sweep.png")
    assert cdfs.read_bytes()[:4] == PNG_MAGIC and sweep.read_bytes()[:4] == PNG_MAGIC


def test_compare_table_has_a_ratio_row_per_rate():
    series = {"colocated": [fake_run("colocated", 4, 0.08)], "disaggregated": [fake_run("disaggregated", 4, 0.02)]}
    lines = format_compare_table(series, [4]).splitlines()
    assert lines[0] == "latencies in ms; goodput = requests/s meeting ttft<=500 ms"
    assert lines[1].startswith("| rate (req/s) | mode | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 |")
    assert lines[3] == "| 4 | colocated | 6 | 100 | 100 | 80 | 80 | 80 | 2.00 | 2/0 |"
    assert lines[4] == "| 4 | disaggregated | 6 | 100 | 100 | 20 | 20 | 20 | 2.00 | 2/0 |"
    assert lines[5] == "| 4 | **disagg/coloc** | 1.00x | 1.00x | 1.00x | 0.25x | 0.25x | 0.25x | 1.00x |  |"


def test_bench_serve_flags():
    args = build_parser().parse_args([
        "bench", "serve", "--backend", "openai", "--random-input-len", "128", "256", "--output-len", "64",
        "--request-rate", "1", "2", "inf", "--max-concurrency", "8", "--goodput", "ttft:1000", "tpot:100"])
    spec = workload_spec(args)
    assert (spec.input_len, spec.output_len) == (LengthRange(128, 256), LengthRange(64, 64))
    assert [load.request_rate for load in loads_of(args)] == [1.0, 2.0, math.inf]
    assert {load.max_concurrency for load in loads_of(args)} == {8}
    assert (args.backend, args.dataset_name, args.num_prompts, args.ignore_eos) == ("openai", "random", 64, False)
