"""benchmarks/gpu_check.py's planning and reports, without a GPU (dry run and "no GPU")."""

import json
import sys

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpu_check import Step, StepResult, markdown_summary, missing_requirements, run_step

STEP_NAMES = ["kernels", "parity_float32", "parity_bfloat16", "decode_bandwidth", "offline_throughput",
              "prefill_decode_pair"]


def test_dry_run_writes_json_and_markdown_listing_every_step(tmp_path):
    assert gpu_check.main(["--out", str(tmp_path), "--dry-run"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [step["name"] for step in report["steps"]] == STEP_NAMES
    assert {step["status"] for step in report["steps"]} == {"skipped"}
    assert "| offline_throughput | skipped |" in (tmp_path / "gpu_check.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU report")
def test_without_a_gpu_every_step_says_so(tmp_path):
    gpu_check.main(["--out", str(tmp_path), "--only", "kernels"])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["machine"] == "no GPU"
    assert [(step["name"], step["detail"]) for step in report["steps"]] == [("kernels", "no GPU")]


def test_missing_modules_and_programs_are_named_and_the_step_skipped(tmp_path):
    step = Step("pair", "needs things", ["true"], 10, needs_modules=("json", "no_such_module_xyz"),
                needs_programs=("no-such-program-xyz",))
    assert missing_requirements(step) == ["no_such_module_xyz", "no-such-program-xyz"]
    assert run_step(step, tmp_path, seconds_left=100).status == "skipped"


def test_a_step_runs_reads_its_figures_and_respects_the_budget(tmp_path):
    script = "import json, sys; json.dump({'gbps': 4.5}, open(sys.argv[1], 'w'))"
    step = Step("bench", "writes figures", [sys.executable, "-c", script, str(tmp_path / "f.json")], 30,
                figures_file="f.json")
    result = run_step(step, tmp_path, seconds_left=100)
    assert (result.status, result.figures) == ("passed", {"gbps": 4.5})
    assert run_step(step, tmp_path, seconds_left=5).detail.startswith("out of time")
    failing = Step("bad", "fails", [sys.executable, "-c", "raise SystemExit(3)"], 30)
    assert run_step(failing, tmp_path, seconds_left=100).status == "failed"
    assert '"gbps": 4.5' in markdown_summary("a GPU", [result, StepResult("x", "y", "skipped")])
