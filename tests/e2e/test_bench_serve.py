"""`pdserve bench serve` against a real stack (Redis, a gateway, one prefill and one decode
instance with the real SmolLM2): 4 short random prompts over gRPC and over the OpenAI HTTP
API, each giving a result JSON with 4 successful requests of exactly their output length
(and, over gRPC, the latency CDF plot); and `make bench-saturation`'s burst of 4 chats sent
at once, all completed."""

import json

import pytest

from services.cli.main import main

NUM_PROMPTS = 4
OUTPUT_LEN = 8


@pytest.fixture(scope="module")
def stack(served_stack):
    return served_stack


def bench_args(result_path, *target) -> list[str]:
    return ["bench", "serve", *target, "--num-prompts", str(NUM_PROMPTS), "--random-input-len", "16", "48",
            "--output-len", str(OUTPUT_LEN), "--ignore-eos", "--request-rate", "inf", "--disable-tqdm",
            "--goodput", "ttft:60000", "--result-json", str(result_path)]


def check_result(result_path) -> None:
    [run] = json.loads(result_path.read_text())["runs"]
    summary = run["summary"]
    assert (summary["num_completed"], summary["num_failed"]) == (NUM_PROMPTS, 0)
    assert summary["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    assert summary["request_goodput"] > 0
    assert [request["error"] for request in run["requests"]] == [None] * NUM_PROMPTS
    assert all(16 <= request["prompt_len"] <= 48 for request in run["requests"])


@pytest.mark.parametrize("backend", ["pdserve-grpc", "openai"])
def test_bench_serve_writes_a_json_with_every_request_done(stack, tmp_path, backend):
    result_path = tmp_path / "result.json"
    if backend == "pdserve-grpc":
        target = ["--gateway", stack.stack.gateway_address, "--plot-dir", str(tmp_path / "plots")]
    else:
        target = ["--backend", "openai", "--base-url", f"http://{stack.stack.ready_info['gateway']['http_address']}"]
    assert main(bench_args(result_path, *target)) == 0
    check_result(result_path)
    if backend == "pdserve-grpc":
        assert (tmp_path / "plots" / "latency_cdfs.png").read_bytes()[:4] == b"\x89PNG"
    stack.wait_all_blocks_free()
    stack.check_children_alive()


def test_a_saturation_burst_of_streaming_chats_all_complete(stack, smollm2_folder):
    """`make bench-saturation`'s burst (benchmarks/saturation.py: NUM_PROMPTS chats sent at once,
    as streaming /v1/chat/completions) through the stack's HTTP door, and its table's row."""
    from benchmarks.saturation import BACKEND, burst_loads, burst_workloads, parse_args, workload_spec
    from benchmarks.saturation_report import format_saturation_table
    from benchmarks.serve_vs_vllm import run_loads
    from services.bench.vocabulary import load_bench_tokenizer

    args = parse_args(["--servers", "pdserve", "--burst-size", str(NUM_PROMPTS), "--rounds", "1",
                       "--input-len", "16", "48", "--output-len", str(OUTPUT_LEN), "--disable-tqdm"])
    [workloads] = burst_workloads(workload_spec(args), load_bench_tokenizer(str(smollm2_folder)), args.burst_size, 1)
    base_url = f"http://{stack.stack.ready_info['gateway']['http_address']}"
    [run] = run_loads(base_url, args, workloads, burst_loads(args), BACKEND, "pdserve")
    assert (run.summary.num_completed, run.summary.num_failed) == (NUM_PROMPTS, 0)
    assert run.summary.total_output_tokens == NUM_PROMPTS * OUTPUT_LEN
    row = format_saturation_table({"pdserve": {NUM_PROMPTS: [run]}}, [NUM_PROMPTS]).splitlines()[3]
    assert row.startswith(f"| {NUM_PROMPTS} | pdserve | 0 | {NUM_PROMPTS} | 0 | 0 | ")
    stack.wait_all_blocks_free()
    stack.check_children_alive()
