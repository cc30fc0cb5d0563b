"""`python -m benchmarks.saturation`: its flags, the bursts' prompt sets, a round against a fake
`vllm serve` (streaming chats, every burst sent at once), and the table's arithmetic: 429s among
the failed, medians over rounds, pdserve's medians over vLLM's."""

import json
import math

import pytest

from services.bench.datasets import LengthRange
from services.bench.metrics import summarize
from services.bench.workload import WorkloadSpec
from benchmarks.saturation import burst_workloads, parse_args, run_round, workload_spec
from benchmarks.saturation_report import format_saturation_table, median_over_rounds, num_refused
from shared.errors import ConfigurationError
from tests.unit.bench_fakes import fake_run, fake_vllm_python  # noqa: F401 - fixture
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture


# ---- flags -------------------------------------------------------------------------------

def test_defaults_are_two_rounds_of_128_and_512_at_once(monkeypatch, tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setenv("PDSERVE_VLLM_PYTHON", str(python))
    args = parse_args([])
    assert (args.servers, args.burst_size, args.rounds) == (["vllm", "pdserve"], [128, 512], 2)
    assert (args.input_len, args.output_len, args.vllm_python) == ([128, 256], 128, python)


@pytest.mark.parametrize("argv, field", [
    (["--burst-size", "16", "0"], "burst-size"), (["--burst-size", "16", "16"], "burst-size"),
    (["--rounds", "0"], "rounds"),
    (["--servers", "pdserve", "pdserve"], "servers"), (["--input-len", "9", "3"], "input-len"),
    (["--request-timeout", "-1"], "request-timeout")])
def test_bad_flags_name_the_flag(argv, field):
    with pytest.raises(ConfigurationError, match=field):
        parse_args(["--servers", "pdserve"] + argv if "--servers" not in argv else argv)


# ---- prompt sets -------------------------------------------------------------------------

def test_every_round_gets_a_fresh_prompt_set_per_burst_size(smollm2_tokenizer):  # noqa: F811
    spec = WorkloadSpec(input_len=LengthRange(16, 48), output_len=LengthRange(4, 4), seed=3)
    rounds = burst_workloads(spec, smollm2_tokenizer, [3, 5], num_rounds=2)
    assert [[len(prompts) for prompts in sets] for _, sets in rounds] == [[3, 5], [3, 5]]
    every_set = [prompts for _, sets in rounds for prompts in sets]
    assert all(16 <= p.prompt_len <= 48 and p.output_len == 4 and p.prompt_text for s in every_set for p in s)
    firsts = {tuple(prompts[0].prompt_token_ids) for prompts in every_set}
    assert len(firsts) == 4  # no set repeats another's prompts (no prefix-cache hits)
    assert len(rounds[0][0]) == 2 and rounds[0][0] == rounds[1][0]  # the same two warm-ups


# ---- a round against a fake vLLM ---------------------------------------------------------

def fake_vllm_args(python, model_folder, tmp_path, *extra: str):
    args = parse_args(["--servers", "vllm", "--vllm-python", str(python), "--model", str(model_folder),
                       "--burst-size", "3", "5", "--input-len", "16", "32", "--output-len", "4",
                       "--ready-timeout", "120", "--disable-tqdm", *extra])
    args.out_dir = tmp_path / "out"
    return args


def test_a_round_sends_every_burst_as_streaming_chats(fake_vllm_python, tiny_llama_folder, tmp_path,  # noqa: F811
                                                      smollm2_tokenizer):  # noqa: F811
    python, bodies = fake_vllm_python
    args = fake_vllm_args(python, tiny_llama_folder, tmp_path)
    [workloads] = burst_workloads(workload_spec(args), smollm2_tokenizer, args.burst_size, num_rounds=1)
    results, broken = {}, set()
    run_round(0, args, workloads, results, broken)
    assert broken == set() and list(results) == ["vllm"] and list(results["vllm"]) == [3, 5]
    for size in (3, 5):
        [run] = results["vllm"][size]
        summary = run.summary
        assert (summary.num_completed, summary.num_failed, summary.total_output_tokens) == (size, 0, 4 * size)
        assert math.isinf(run.load.request_rate) and run.label == f"vllm round 0 N={size}"
    sent = [json.loads(line) for line in bodies.read_text().splitlines()]
    assert len(sent) == 2 + 3 + 5 and {body["path"] for body in sent} == {"/v1/chat/completions"}
    burst_texts = sorted(body["messages"][0]["content"] for body in sent[2:])
    assert burst_texts == sorted(p.prompt_text for prompts in workloads[1] for p in prompts)
    assert all(body["stream"] and body["ignore_eos"] and body["temperature"] == 0.0 for body in sent)
    assert (tmp_path / "out" / "round-0" / "server-vllm" / "vllm.log").is_file()


def test_a_server_that_does_not_start_is_skipped_in_later_rounds(tiny_llama_folder, tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 3\n")
    python.chmod(0o755)
    args = fake_vllm_args(python, tiny_llama_folder, tmp_path)
    results, broken = {}, set()
    run_round(0, args, ([], [[], []]), results, broken)
    assert (results, broken) == ({}, {"vllm"})
    run_round(1, args, ([], [[], []]), results, broken)
    assert not (tmp_path / "out" / "round-1").exists()


# ---- the table ---------------------------------------------------------------------------

def test_refused_requests_are_counted_among_the_failed():
    refused = fake_run("pdserve", 0.5, 0.1, failed=3, error="HTTP 429: {\"error\": \"too busy\"}")
    assert (refused.summary.num_failed, num_refused(refused)) == (3, 3)
    assert num_refused(fake_run("pdserve", 0.5, 0.1, failed=3, error="HTTP 500: oops")) == 0


def test_the_median_over_rounds_leaves_out_rounds_without_the_figure():
    assert median_over_rounds([3.0, math.nan, 1.0, 2.0]) == 2.0
    assert median_over_rounds([1.0, 2.0]) == 1.5
    assert math.isnan(median_over_rounds([math.nan, math.nan]))


def test_table_has_every_round_each_servers_median_and_the_ratios_to_vllm():
    # binary fractions, so the medians and ratios are exact
    results = {"vllm": {3: [fake_run("vllm", 1.0, 0.5, duration_s=1.0), fake_run("vllm", 2.0, 0.5, duration_s=0.5)]},
               "pdserve": {3: [fake_run("pdserve", 0.5, 0.125, failed=1, error="HTTP 429: busy", duration_s=0.5),
                               fake_run("pdserve", 0.25, 0.125, duration_s=0.5)]}}
    lines = format_saturation_table(results, [3]).splitlines()
    assert lines[1] == ("| N | server | round | ok | failed | 429 | out tok/s | total tok/s | TTFT p50 | TTFT p99 |"
                        " ITL p50 | ITL p99 |")
    assert lines[3:] == [
        "| 3 | vllm | 0 | 2 | 0 | 0 | 6 | 22 | 1000 | 1000 | 500 | 500 |",
        "| 3 | vllm | 1 | 2 | 0 | 0 | 12 | 44 | 2000 | 2000 | 500 | 500 |",
        "| 3 | pdserve | 0 | 2 | 1 | 1 | 12 | 44 | 500 | 500 | 125 | 125 |",
        "| 3 | pdserve | 1 | 2 | 0 | 0 | 12 | 44 | 250 | 250 | 125 | 125 |",
        "| 3 | **vllm** | median | 2 | 0 | 0 | 9 | 33 | 1500 | 1500 | 500 | 500 |",
        "| 3 | **pdserve** | median | 2 | 0.5 | 0.5 | 12 | 44 | 375 | 375 | 125 | 125 |",
        "| 3 | **pdserve / vllm** | median |  |  |  | 1.33x | 1.33x | 0.25x | 0.25x | 0.25x | 0.25x |"]


def test_a_round_with_nothing_completed_shows_no_latency_and_without_vllm_no_ratio():
    nothing_done = fake_run("pdserve", 0.5, 0.125, failed=2, error="HTTP 429: busy")
    nothing_done.records[:2] = []  # only the two refused requests are left
    nothing_done.summary = summarize(nothing_done.records, duration_s=1.0, percentiles=(50, 99))
    results = {"pdserve": {2: [nothing_done, fake_run("pdserve", 0.5, 0.125, duration_s=0.5)]}}
    lines = format_saturation_table(results, [2]).splitlines()
    assert lines[3] == "| 2 | pdserve | 0 | 0 | 2 | 2 | 0 | 0 | - | - | - | - |"
    assert lines[5] == "| 2 | **pdserve** | median | 1 | 1 | 1 | 6 | 22 | 500 | 500 | 125 | 125 |"
    assert len(lines) == 6 and "/ vllm" not in "\n".join(lines)
