"""`python -m benchmarks.serve_vs_vllm`: its flags, the servers it starts (a fake `vllm serve`
standing in for vLLM), readiness waiting, the stop of a process group, and its table."""

import asyncio
import http.server
import json
import math
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from services.bench.clients import ClientOptions
from services.bench.datasets import BenchPrompt
from services.bench.runner import LoadShape
from services.bench.sweep import run_sweep
from benchmarks.serve_servers import (ServerOptions, ServerStartError, pdserve_server, pdserve_stack_config,
                                      stop_process_group, vllm_argv, vllm_server, wait_until_http_ready)
from benchmarks.serve_vs_vllm import parse_args
from benchmarks.serve_goodput import GoodputSLO, attainment, goodput, goodput_document, goodput_lines
from benchmarks.serve_vs_vllm_table import format_table, ratio, target_lines
from tests.unit.bench_fakes import fake_run, fake_vllm_python  # noqa: F401 - fixture
from services.launcher.cpu_plan import InstanceCpus, plan_instance_cpus
from shared.errors import ConfigurationError


# ---- flags -------------------------------------------------------------------------------

def test_vllm_needs_its_interpreter(monkeypatch):
    monkeypatch.delenv("PDSERVE_VLLM_PYTHON", raising=False)
    with pytest.raises(ConfigurationError, match="vllm-python"):
        parse_args([])
    assert parse_args(["--servers", "pdserve"]).vllm_python is None


def test_vllm_interpreter_comes_from_the_environment(monkeypatch, tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setenv("PDSERVE_VLLM_PYTHON", str(python))
    args = parse_args(["--request-rate", "0.2", "4"])
    assert args.vllm_python == python and args.servers == ["vllm", "pdserve"] and args.request_rate == [0.2, 4.0]
    monkeypatch.setenv("PDSERVE_VLLM_PYTHON", str(tmp_path / "missing"))
    with pytest.raises(ConfigurationError, match="vllm-python"):
        parse_args([])


@pytest.mark.parametrize("argv, field", [
    (["--request-rate", "0"], "request-rate"), (["--request-rate", "inf", "-1"], "request-rate"),
    (["--num-prompts", "0"], "num-prompts"), (["--output-len", "0"], "output-len"),
    (["--input-len", "9", "3"], "input-len"), (["--servers", "pdserve", "pdserve"], "servers"),
    (["--request-timeout", "0"], "request-timeout")])
def test_bad_flags_name_the_flag(argv, field):
    with pytest.raises(ConfigurationError, match=field):
        parse_args(["--servers", "pdserve"] + argv if "--servers" not in argv else argv)


def test_vllm_command_line_serves_the_folder_on_the_port(tmp_path):
    options = ServerOptions(dtype="bfloat16", vllm_memory_utilization=0.2, vllm_args=("--max-num-seqs", "64"))
    argv = vllm_argv(Path("/venv/bin/python"), tmp_path, 8123, options)
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags == {"--model": str(tmp_path), "--host": "127.0.0.1", "--port": "8123", "--dtype": "bfloat16",
                     "--seed": "0", "--gpu-memory-utilization": "0.2", "--max-num-seqs": "64"}


# ---- pdserve layouts ---------------------------------------------------------------------

def placements(layout: str, tmp_path: Path) -> dict[str, InstanceCpus]:
    config = pdserve_stack_config(layout, ServerOptions(), tmp_path, num_cpus=2)
    assert config.gateway_port == 0 and config.gateway_http_port == 0
    return plan_instance_cpus(config, config.instance_roles(), [0, 1])


def test_pdserve_layouts_place_instances_as_named(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert placements("pdserve-pinned", tmp_path) == {"prefill-0": InstanceCpus((0,), 1),
                                                      "decode-0": InstanceCpus((1,), 1)}
    assert placements("pdserve-pinned-gateway", tmp_path) == placements("pdserve-pinned", tmp_path)
    gateway_pinned = pdserve_stack_config("pdserve-pinned-gateway", ServerOptions(), tmp_path, num_cpus=2)
    assert gateway_pinned.cpus_of("gateway") == gateway_pinned.cpus_of("redis") == (0,)
    assert placements("pdserve-unpinned", tmp_path) == {"prefill-0": InstanceCpus((0, 1), 2),
                                                        "decode-0": InstanceCpus((0, 1), 2)}
    assert placements("pdserve-colocated", tmp_path) == {"colocated-0": InstanceCpus((0, 1), 2)}
    with pytest.raises(ValueError, match="layout"):
        pdserve_stack_config("pdserve-other", ServerOptions(), tmp_path, num_cpus=2)


# ---- readiness ---------------------------------------------------------------------------

class FlakyHealth(http.server.BaseHTTPRequestHandler):
    """GET answers 503 `failures_left` times, then 200."""

    failures_left = 0
    hits = 0

    def do_GET(self):
        type(self).hits += 1
        ready = type(self).failures_left <= 0
        type(self).failures_left -= 1
        self.send_response(200 if ready else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FlakyHealth)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()
    server.server_close()


def test_waiting_returns_once_the_server_answers_200(health_server):
    _, url = health_server
    FlakyHealth.failures_left, FlakyHealth.hits = 2, 0
    wait_until_http_ready(url, lambda: True, timeout_s=60, what="fake", poll_interval_s=0.01)
    assert FlakyHealth.hits == 3


def test_waiting_stops_when_the_server_exits_or_the_deadline_passes(health_server):
    _, url = health_server
    FlakyHealth.failures_left, FlakyHealth.hits = 10**6, 0
    with pytest.raises(ServerStartError, match="fake exited"):
        wait_until_http_ready(url, lambda: False, timeout_s=60, what="fake")
    assert FlakyHealth.hits == 0
    with pytest.raises(ServerStartError, match="did not answer"):
        wait_until_http_ready(url, lambda: True, timeout_s=0, what="fake")
    assert FlakyHealth.hits == 1


def test_stopping_a_process_group_reaps_its_leader():
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    stop_process_group(process, grace_s=30)
    assert process.returncode == -signal.SIGTERM


# ---- a fake `vllm serve` (tests/unit/bench_fakes.py) -------------------------------------

def test_vllm_server_starts_serves_the_workload_and_stops(fake_vllm_python,  # noqa: F811
                                                           tiny_llama_folder, tmp_path):
    python, bodies = fake_vllm_python
    options = ServerOptions(model=str(tiny_llama_folder), vllm_python=python, ready_timeout_s=120)
    prompts = [BenchPrompt([5, 6, 7], 4), BenchPrompt([8, 9], 4)]
    with vllm_server(options, tmp_path / "run") as base_url:
        client = ClientOptions("openai", base_url, model=str(tiny_llama_folder))
        [run] = asyncio.run(run_sweep(client, [prompts], [LoadShape(math.inf)], {}, "vllm", prompts[:1],
                                      show_progress=False))
    assert run.summary.num_completed == 2 and run.summary.num_failed == 0
    assert run.summary.total_output_tokens == 8
    sent = [json.loads(line) for line in bodies.read_text().splitlines()]
    assert {body["path"] for body in sent} == {"/v1/completions"}
    assert len(sent) == 3  # the warm-up, then the two prompts
    assert sorted(body["prompt"] for body in sent[1:]) == [[5, 6, 7], [8, 9]]
    assert all(body["ignore_eos"] is True and body["temperature"] == 0.0 and body["stream"] for body in sent)
    with pytest.raises(OSError):  # stopped: nothing listens on its port any more
        import urllib.request
        urllib.request.urlopen(f"{base_url}/health", timeout=5)


def test_vllm_server_that_exits_is_reported_with_its_log(tmp_path, tiny_llama_folder):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho no vllm here\nexit 3\n")
    python.chmod(0o755)
    options = ServerOptions(model=str(tiny_llama_folder), vllm_python=python, ready_timeout_s=120)
    with pytest.raises(ServerStartError, match="vllm.log"):
        with vllm_server(options, tmp_path / "run"):
            pass
    assert "no vllm here" in (tmp_path / "run" / "vllm.log").read_text()


# ---- the table ---------------------------------------------------------------------------

def test_table_has_every_server_and_the_ratios_to_vllm():
    # binary fractions, so the ratios land exactly on the targets
    series = {"vllm": [fake_run("vllm", 1.0, 0.5)], "pdserve": [fake_run("pdserve", 0.5, 0.125, failed=1)]}
    table = format_table(series, [0.2])
    lines = table.splitlines()
    assert lines[1] == ("| rate (req/s) | server | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | ITL max |"
                        " ok/failed |")
    assert lines[3] == "| 0.2 | vllm | 6 | 1000 | 1000 | 500 | 500 | 500 | 2/0 |"
    assert lines[4] == "| 0.2 | pdserve | 6 | 500 | 500 | 125 | 125 | 125 | 2/1 |"
    assert lines[5] == "| 0.2 | **pdserve / vllm** | 1.00x | 0.50x | 0.50x | 0.25x | 0.25x | 0.25x |  |"
    assert target_lines(series, [0.2]) == [
        "- 0.2 req/s, pdserve: TTFT p99 0.50x of vLLM's (target <= 1.0x: met), ITL p99 0.25x (target <= 0.5x: met), "
        "output tok/s 1.00x (target >= 1.0x: met)"]


def test_table_without_vllm_has_no_ratios_and_targets_can_fail():
    alone = {"pdserve": [fake_run("pdserve", 0.4, 0.1)]}
    assert "/ vllm" not in format_table(alone, [1.0]) and target_lines(alone, [1.0]) == []
    series = {"vllm": [fake_run("vllm", 1.0, 0.1)], "pdserve": [fake_run("pdserve", 1.25, 0.125, duration_s=1.25)]}
    assert target_lines(series, [1.0]) == [
        "- 1 req/s, pdserve: TTFT p99 1.25x of vLLM's (target <= 1.0x: not met), ITL p99 1.25x (target <= 0.5x: "
        "not met), output tok/s 0.80x (target >= 1.0x: not met)"]
    assert math.isnan(ratio(1.0, 0.0)) and math.isnan(ratio(math.nan, 1.0))


def test_a_pdserve_stack_that_fails_to_start_is_a_server_start_error(tmp_path, monkeypatch):
    from services.launcher.errors import StackError
    from services.launcher.stack import LocalStack

    def fail(self, should_abort=None):
        raise StackError("decode-0 exited with status 1")
    monkeypatch.setattr(LocalStack, "start", fail)
    with pytest.raises(ServerStartError, match="pdserve pdserve-colocated: decode-0 exited.*logs"):
        with pdserve_server("pdserve-colocated", ServerOptions(), tmp_path / "run"):
            pass


# ---- goodput -----------------------------------------------------------------------------

def test_goodput_is_the_highest_rate_whose_requests_meet_both_slos():
    slo = GoodputSLO(ttft_s=1.0, tpot_s=0.1, attainment=0.9)
    runs = [fake_run("vllm", 0.5, 0.05, rate=1), fake_run("vllm", 0.75, 0.0625, rate=2),
            fake_run("vllm", 1.5, 0.05, rate=4), fake_run("vllm", 0.5, 0.2, rate=6)]
    assert [attainment(run, slo) for run in runs] == [1.0, 1.0, 0.0, 0.0]
    assert goodput(runs, slo) == 2
    # a failed request is a missed one: 2 of 3 met, below 90%
    assert attainment(fake_run("x", 0.5, 0.05, failed=1), slo) == pytest.approx(2 / 3)
    assert goodput([fake_run("x", 2.0, 0.05)], slo) == 0.0


def test_goodput_lines_compare_pdserve_with_vllm_against_the_target():
    slo = GoodputSLO()
    series = {"vllm": [fake_run("vllm", 0.5, 0.05, rate=1), fake_run("vllm", 2.0, 0.05, rate=2)],
              "pdserve": [fake_run("pdserve", 2.0, 0.05, rate=1), fake_run("pdserve", 0.5, 0.05, rate=2)]}
    lines = goodput_lines(series, slo)
    assert lines[1] == "- vllm: goodput 1 req/s; attainment per rate 1: 100%, 2: 0%"
    assert lines[2] == "- pdserve: goodput 2 req/s (but missed at 1 req/s); attainment per rate 1: 0%, 2: 100%"
    assert lines[3] == "- pdserve / vLLM goodput: 2.00x (target >= 1.3x: met)"
    assert "goodput" in format_table(series, [1, 2], slo)


def test_goodput_slos_default_to_one_second_ttft_and_150_ms_tpot(monkeypatch):
    monkeypatch.delenv("PDSERVE_VLLM_PYTHON", raising=False)
    args = parse_args(["--servers", "pdserve"])
    assert (args.goodput_ttft_ms, args.goodput_tpot_ms, args.goodput_attainment) == (1000, 150, 0.9)
    assert GoodputSLO() == GoodputSLO(ttft_s=1.0, tpot_s=0.15, attainment=0.9)
    # TPOT 125 ms: within the default SLO, not within 100 ms
    run = fake_run("pdserve", 0.5, 0.125, rate=4)
    assert goodput([run], GoodputSLO()) == 4 and goodput([run], GoodputSLO(tpot_s=0.1)) == 0
    with pytest.raises(ConfigurationError, match="goodput-tpot-ms"):
        parse_args(["--servers", "pdserve", "--goodput-tpot-ms", "0"])


def test_goodput_document_holds_each_servers_goodput_and_attainment_per_rate():
    series = {"vllm": [fake_run("vllm", 0.5, 0.05, rate=1), fake_run("vllm", 2.0, 0.05, rate=2)],
              "pdserve": [fake_run("pdserve", 0.5, 0.125, rate=1), fake_run("pdserve", 0.5, 0.05, failed=1, rate=2)]}
    assert goodput_document(series, GoodputSLO(tpot_s=0.125, attainment=0.5)) == {
        "slo": {"ttft_ms": 1000.0, "tpot_ms": 125.0, "attainment": 0.5},
        "servers": {"vllm": {"goodput_req_s": 1.0, "attainment_by_rate": {"1": 1.0, "2": 0.0}},
                    "pdserve": {"goodput_req_s": 2.0, "attainment_by_rate": {"1": 1.0, "2": 2 / 3}}}}
