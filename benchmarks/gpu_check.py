"""One GPU check of the CUDA path, run by scripts/gpu_check.sh on a machine with an NVIDIA GPU.

Each step runs in its own subprocess under its own time limit (a crash or a hang in one step
cannot take the others down) and may leave a JSON of figures; the driver writes them all to
`<out>/gpu_check.json` and a markdown summary to `<out>/gpu_check.md`. Steps whose Python
modules or programs are missing are reported as skipped, naming what is missing.

    python -m benchmarks.gpu_check [--out DIR] [--model FOLDER] [--dry-run]

Without a GPU every step reports "no GPU"; `--dry-run` lists the steps without running them.
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from benchmarks.engine_flags import add_engine_arguments

KERNEL_TESTS = ["tests/unit/test_triton_attention.py", "tests/unit/test_triton_layer_kernels.py"]
PAIR_TEST = "tests/e2e/test_disaggregated_generation.py"
# A step is not started with less time than this left.
MIN_STEP_SECONDS = 20


@dataclass
class Step:
    name: str
    description: str
    argv: list[str]
    timeout_s: int
    needs_modules: tuple[str, ...] = ()
    needs_programs: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    figures_file: str | None = None


@dataclass
class StepResult:
    name: str
    description: str
    status: str  # passed | failed | timeout | skipped
    seconds: float = 0.0
    detail: str = ""
    figures: dict | None = None


def build_steps(out: Path, model: str | None) -> list[Step]:
    python = sys.executable
    model_args = ["--model", model] if model else []
    return [
        Step("kernels", "Triton kernel tests on the GPU (fp32, fp16, bf16) vs float64 references",
             [python, "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider", *KERNEL_TESTS], 150,
             needs_modules=("pytest", "triton")),
        Step("parity_float32", "SmolLM2 greedy parity with transformers on the GPU, float32",
             [python, "-m", "benchmarks.gpu_parity", "--dtype", "float32", *model_args,
              "--json", str(out / "parity_float32.json")], 75, figures_file="parity_float32.json"),
        Step("parity_bfloat16", "SmolLM2 greedy parity with transformers on the GPU, bfloat16",
             [python, "-m", "benchmarks.gpu_parity", "--dtype", "bfloat16", *model_args,
              "--json", str(out / "parity_bfloat16.json")], 75, figures_file="parity_bfloat16.json"),
        Step("decode_bandwidth", "decode attention GB/s vs a device-to-device copy (target >= 80%)",
             [python, "-m", "benchmarks.decode_bandwidth", "--json", str(out / "decode_bandwidth.json")], 45,
             figures_file="decode_bandwidth.json"),
        Step("offline_throughput", "64-prompt offline benchmark, pdserve vs transformers, same GPU",
             [python, "-m", "benchmarks.offline", "--device", "cuda", *model_args,
              "--json", str(out / "offline.json")], 120, figures_file="offline.json"),
        Step("prefill_decode_pair", "gateway + prefill + decode processes on one GPU, KV staged over UCX",
             [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", PAIR_TEST, "-k", "greedy_output"], 120,
             needs_modules=("pytest", "redis", "ucxx", "grpc"), needs_programs=("redis-server",),
             env={"PDSERVE_DEVICE": "cuda"}),
    ]


def missing_requirements(step: Step) -> list[str]:
    missing = [name for name in step.needs_modules if importlib.util.find_spec(name) is None]
    return missing + [name for name in step.needs_programs if shutil.which(name) is None]


def run_step(step: Step, out: Path, seconds_left: float) -> StepResult:
    missing = missing_requirements(step)
    if missing:
        return StepResult(step.name, step.description, "skipped", detail=f"missing: {', '.join(missing)}")
    timeout_s = min(step.timeout_s, seconds_left)
    if timeout_s < MIN_STEP_SECONDS:
        return StepResult(step.name, step.description, "skipped", detail="out of time (see --budget-s)")
    started = time.perf_counter()
    try:
        completed = subprocess.run(step.argv, env=os.environ | step.env, capture_output=True, text=True,
                                   timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return StepResult(step.name, step.description, "timeout", time.perf_counter() - started,
                          f"over {timeout_s:.0f} s")
    seconds = time.perf_counter() - started
    status = "passed" if completed.returncode == 0 else "failed"
    tail = (completed.stdout + completed.stderr).strip().splitlines()[-15:]
    return StepResult(step.name, step.description, status, seconds, "\n".join(tail), read_figures(step, out))


def read_figures(step: Step, out: Path) -> dict | None:
    if step.figures_file is None or not (out / step.figures_file).exists():
        return None
    return json.loads((out / step.figures_file).read_text())


def gpu_description() -> str | None:
    """The GPU's name and software versions, or None without a usable GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    triton_version = "absent"
    if importlib.util.find_spec("triton") is not None:
        import triton
        triton_version = triton.__version__
    return (f"{torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB), "
            f"torch {torch.__version__}, CUDA {torch.version.cuda}, triton {triton_version}, "
            f"Python {sys.version.split()[0]}")


def markdown_summary(machine: str, results: list[StepResult]) -> str:
    lines = ["# pdserve GPU check", "", f"Machine: {machine}", "", "| step | status | seconds | what |",
             "|---|---|---|---|"]
    for result in results:
        lines.append(f"| {result.name} | {result.status} | {result.seconds:.0f} | {result.description} |")
    for result in results:
        if result.figures or result.detail:
            lines += ["", f"## {result.name}", ""]
            if result.figures:
                lines += ["```json", json.dumps(result.figures, indent=2), "```"]
            if result.detail:
                lines += ["```", result.detail, "```"]
    return "\n".join(lines) + "\n"


def write_report(out: Path, machine: str, results: list[StepResult]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine, "steps": [asdict(result) for result in results]}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    (out / "gpu_check.md").write_text(markdown_summary(machine, results))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu_check_out"), help="where the reports go")
    add_engine_arguments(parser, "model")
    parser.add_argument("--only", action="append", default=[], help="run only these steps (repeatable)")
    parser.add_argument("--budget-s", type=float, default=570, help="seconds for all steps together")
    parser.add_argument("--dry-run", action="store_true", help="list the steps and write a report without running")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    steps = [step for step in build_steps(args.out.resolve(), args.model) if not args.only or step.name in args.only]
    machine = gpu_description()
    if args.dry_run or machine is None:
        reason = "dry run" if args.dry_run else "no GPU"
        results = [StepResult(step.name, step.description, "skipped", detail=reason) for step in steps]
        machine = machine or "no GPU"
    else:
        results, deadline = [], time.monotonic() + args.budget_s
        for step in steps:
            print(f"[gpu_check] {step.name}: {step.description}", flush=True)
            results.append(run_step(step, args.out.resolve(), deadline - time.monotonic()))
            print(f"[gpu_check] {step.name}: {results[-1].status} in {results[-1].seconds:.0f} s", flush=True)
    write_report(args.out, machine, results)
    print((args.out / "gpu_check.md").read_text())
    return 0 if all(result.status in ("passed", "skipped") for result in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
